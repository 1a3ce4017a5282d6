"""PCI resource mappings (/cluster/mapping/pci, /etc/pve/mapping/pci.cfg) and VMs that use them:
a token may pass a GPU to a VM only through a mapping it has Mapping.Use on; at start the mapping
is checked against the live device (pve-guest-common Mapping/PCI.pm assert_valid)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxmoxer import ProxmoxAPI, ResourceException

from tests.twin.pve_helpers import make_hw_root, run, write_conf
from twin import hwsim
from twin.pve import access, api

TOKEN = "root@pam!gpuhost"
# kpro6: GPU 0000:41:00.0 (10de:2bb1) with its audio function, IOMMU group 18
GPU41 = "node=kpro6,path=0000:41:00,id=10de:2bb1,iommugroup=18,subsystem-id=10de:204b"


def client(root: Path, port: int, token: str, secret: str) -> ProxmoxAPI:
    return ProxmoxAPI("127.0.0.1", port=port, user="root@pam", token_name=token,
                      token_value=secret, verify_ssl=str(root / "etc/pve/pve-root-ca.pem"))  # fmt: skip


PORTS: dict[Path, int] = {}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, ProxmoxAPI]]:
    root = make_hw_root(tmp_path)
    write_conf(root, "qemu", 129, "cores: 4\nmachine: q35\nmemory: 8192\nname: vm129\n")
    secret = api.create_token(root, "root@pam", "gpuhost")
    for path, role in access.GPUHOST_TOKEN_ACLS:
        access.grant(root, path, role, TOKEN)
    server, thread = api.serve_in_thread(root, "127.0.0.1", 0)
    PORTS[root] = server.server_address[1]
    yield root, client(root, server.server_address[1], "gpuhost", secret)
    server.shutdown()
    server.server_close()
    thread.join()


def wait(px: ProxmoxAPI, upid: str) -> str:
    for _ in range(200):
        status = px.nodes("kpro6").tasks(upid).status.get()
        if status["status"] == "stopped":
            return str(status["exitstatus"])
        time.sleep(0.05)
    raise AssertionError(f"task {upid} did not stop")


def subsystem(root: Path) -> str:
    d = root / "sys/bus/pci/devices/0000:41:00.0"
    return ":".join(
        (d / f).read_text().strip()[2:] for f in ("subsystem_vendor", "subsystem_device")
    )


def test_create_read_update_delete(served: tuple[Path, ProxmoxAPI]) -> None:
    root, px = served
    gpu = GPU41.replace("10de:204b", subsystem(root))
    px.cluster.mapping.pci.post(id="gpu41", map=[gpu, gpu.replace("kpro6", "other")],
                                description="RTX PRO 6000 in slot 3")  # fmt: skip
    text = (root / "etc/pve/mapping/pci.cfg").read_text()
    assert text == (
        f"gpu41\n\tmap {gpu}\n\tmap {gpu.replace('kpro6', 'other')}\n"
        "\tdescription RTX PRO 6000 in slot 3\n\n"
    )
    (entry,) = px.cluster.mapping.pci.get()
    assert entry["id"] == "gpu41" and len(entry["map"]) == 2 and len(entry["digest"]) == 40
    assert px.cluster.mapping.pci.get(**{"check-node": "kpro6"})[0]["checks"] == []
    with pytest.raises(ResourceException) as exc:
        px.cluster.mapping.pci.post(id="gpu41", map=gpu)
    assert exc.value.content == "create hardware mapping failed: pci ID 'gpu41' already defined"
    with pytest.raises(ResourceException) as exc:
        px.cluster.mapping.pci.post(id="bad", map="node=kpro6,path=41:00,id=10de:2bb1")
    assert exc.value.status_code == 400 and "map" in exc.value.errors
    px.cluster.mapping.pci("gpu41").put(delete="description", mdev=0)
    got = px.cluster.mapping.pci("gpu41").get()
    assert "description" not in got and got["mdev"] == 0
    with pytest.raises(ResourceException) as exc:
        px.cluster.mapping.pci("gpu41").put(mdev=1, digest="0" * 40)
    assert "file changed by other user" in exc.value.content
    px.cluster.mapping.pci("gpu41").delete()
    assert px.cluster.mapping.pci.get() == []
    with pytest.raises(ResourceException) as exc:
        px.cluster.mapping.pci("gpu41").get()
    assert exc.value.content == "mapping 'gpu41' not found"


def test_mapping_privileges(served: tuple[Path, ProxmoxAPI]) -> None:
    root, _ = served
    rc, _, err = run(root, "pvesh", "create", "/cluster/mapping/pci", "--id", "gpu41",
                     "--map", GPU41, "--map", GPU41.replace("kpro6", "other"))  # fmt: skip
    assert rc == 0, err  # root@pam through pvesh, `map` repeated
    secret = access.add_token(root, "root@pam", "user")
    access.grant(root, "/vms", "PVEVMAdmin", "root@pam!user")
    user = client(root, PORTS[root], "user", secret)
    assert user.cluster.mapping.pci.get() == []  # no Mapping.* on it: not listed
    with pytest.raises(ResourceException) as exc:
        user.cluster.mapping.pci.post(id="gpu1", map=GPU41)
    assert exc.value.content == "Permission check failed (/mapping/pci, Mapping.Modify)"
    with pytest.raises(ResourceException) as exc:  # VM.Config.HWType alone is not enough
        user.nodes("kpro6").qemu(129).config.put(hostpci0="mapping=gpu41,pcie=1")
    assert exc.value.content == "Permission check failed (/mapping/pci/gpu41, Mapping.Use)"
    access.grant(root, "/mapping/pci/gpu41", "PVEMappingUser", "root@pam!user")
    assert [m["id"] for m in user.cluster.mapping.pci.get()] == ["gpu41"]
    user.nodes("kpro6").qemu(129).config.put(hostpci0="mapping=gpu41,pcie=1")
    with pytest.raises(ResourceException) as exc:  # romfile stays root-only
        user.nodes("kpro6").qemu(129).config.put(hostpci0="mapping=gpu41,romfile=x.rom")
    assert exc.value.errors == {"hostpci0": "only root@pam can set 'romfile' option"}


def test_vm_start_resolves_and_checks_the_mapping(served: tuple[Path, ProxmoxAPI]) -> None:
    root, px = served
    vm = px.nodes("kpro6").qemu(129)
    vm.config.put(hostpci0="mapping=gpu41,pcie=1")  # setting it does not resolve it
    assert wait(px, vm.status.start.post()) == "PCI device mapping not found for 'gpu41'"
    px.cluster.mapping.pci.post(id="gpu41", map=GPU41.replace("kpro6", "other"))
    assert wait(px, vm.status.start.post()) == "PCI device mapping not found for 'gpu41'"
    wrong = GPU41.replace("10de:204b", subsystem(root)).replace("id=10de:2bb1", "id=10de:2330")
    px.cluster.mapping.pci("gpu41").put(map=wrong)
    assert wait(px, vm.status.start.post()) == (
        "PCI device mapping invalid (hardware probably changed): "
        "'id' does not match for 'gpu41' (10de:2bb1 != 10de:2330)"
    )
    px.cluster.mapping.pci("gpu41").put(map=GPU41.replace("iommugroup=18", "iommugroup=7"))
    status = wait(px, vm.status.start.post())
    assert "does not match for 'gpu41'" in status and vm.status.current.get()["status"] == "stopped"
    px.cluster.mapping.pci("gpu41").put(map=GPU41.replace("10de:204b", subsystem(root)))
    assert wait(px, vm.status.start.post()) == "OK"
    bindings = hwsim.Hw(root).state["bindings"]
    assert bindings["0000:41:00.0"] == bindings["0000:41:00.1"] == "vfio-pci"
    reservations = (root / "run/qemu-server/pci-id-reservations").read_text()
    assert "0000:41:00.0 129 pid:" in reservations
    checks = px.cluster.mapping.pci.get(**{"check-node": "kpro6"})[0]["checks"]
    assert checks == []
    assert json.loads(run(root, "pvesh", "get", "/nodes/kpro6/qemu/129/status/current",
                          "--output-format", "json")[1])["status"] == "running"  # fmt: skip
