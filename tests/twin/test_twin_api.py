"""Every profiled twin serves the Proxmox API (https :8006, API tokens) over its /etc/pve files."""

from __future__ import annotations

import time

import pytest
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from twin.pytest_plugin import TwinHandle

twin_profile = "kpro6"


def client(twin: TwinHandle, secret: str | None = None) -> ProxmoxAPI:
    user_token, real_secret = (twin.twin.dir / "api-token").read_text().strip().split("=", 1)
    user, token = user_token.split("!")
    return ProxmoxAPI(
        twin.address,
        port=8006,
        user=user,
        token_name=token,
        token_value=secret or real_secret,
        verify_ssl=str(twin.root / "etc/pve/local/pve-ssl.pem"),  # the twin's own certificate
    )


def test_api_reads_what_pct_writes_and_survives_a_reboot(twin: TwinHandle) -> None:
    api = client(twin)
    (node,) = api.nodes.get()
    assert node["node"] == twin.name  # the node is named after the host, like Proxmox
    rc, _, err = twin.run(
        "mkdir -p /etc/pve/lxc && printf 'arch: amd64\\nhostname: ct200\\nostype: debian\\n' >/etc/pve/lxc/200.conf"
        " && pct set 200 -dev0 /dev/null,gid=44"  # pct checks the node exists
    )
    assert rc == 0, err
    config = api.nodes(twin.name).lxc(200).config.get()
    assert config["dev0"] == "/dev/null,gid=44" and "digest" in config
    twin.reboot()
    assert client(twin).nodes(twin.name).lxc(200).config.get()["dev0"] == "/dev/null,gid=44"


def test_api_refuses_a_wrong_token(twin: TwinHandle) -> None:
    with pytest.raises(ResourceException, match="401"):
        client(twin, secret="00000000-0000-0000-0000-000000000000").nodes.get()


def test_root_over_ssh_may_what_the_token_may_not(twin: TwinHandle) -> None:
    """pvesh as root@pam inside the twin (the deploy's SSH connection) vs the API token."""
    api = client(twin)
    rc, _, err = twin.run("pct set 200 -dev1 /dev/zero")  # root: fine
    assert rc == 0, err
    with pytest.raises(ResourceException) as exc:
        api.nodes(twin.name).lxc(200).config.put(dev2="/dev/zero")
    assert exc.value.status_code == 403 and "only allowed for root@pam" in exc.value.content
    gpu = f"node={twin.name},path=0000:41:00,id=10de:2bb1,iommugroup=18"
    rc, _, err = twin.run(f"pvesh create /cluster/mapping/pci --id gpu41 --map {gpu}")
    assert rc == 0, err
    assert "gpu41" in [m["id"] for m in api.cluster.mapping.pci.get()]
    assert "\tmap " + gpu + "\n" in twin.run("cat /etc/pve/mapping/pci.cfg")[1]


def test_a_token_passes_a_gpu_through_a_mapping(twin: TwinHandle) -> None:
    """The whole VM path on a running twin: root makes the VM and the mapping (pvesh over SSH),
    the token sets `mapping=` and starts the VM; the start binds the group to vfio-pci."""
    api = client(twin)
    sysfs = "/sys/bus/pci/devices/0000:41:00.0"
    rc, sub, _ = twin.run(f"echo $(cat {sysfs}/subsystem_vendor):$(cat {sysfs}/subsystem_device)")
    sub = sub.strip().replace("0x", "")
    rc, _, err = twin.run(f"pvesh create /nodes/{twin.name}/qemu --vmid 129 --machine q35")
    assert rc == 0, err
    gpu = f"node={twin.name},path=0000:41:00,id=10de:2bb1,iommugroup=18,subsystem-id={sub}"
    rc, _, err = twin.run(f"pvesh create /cluster/mapping/pci --id vmgpu --map {gpu}")
    assert rc == 0, err
    vm = api.nodes(twin.name).qemu(129)
    vm.config.put(hostpci0="mapping=vmgpu,pcie=1")
    upid = vm.status.start.post()
    for _ in range(100):
        status = api.nodes(twin.name).tasks(upid).status.get()
        if status["status"] == "stopped":
            break
        time.sleep(0.1)
    assert status["exitstatus"] == "OK" and status["user"] == "root@pam!gpuhost"
    assert twin.run(f"basename $(readlink {sysfs}/driver)")[1] == "vfio-pci\n"
    assert twin.run("qm status 129")[1] == "status: running\n"
