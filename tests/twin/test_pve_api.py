"""The twin's Proxmox API over HTTPS, driven by the real proxmoxer client (docs/reference/pve-api.md): a
privilege-separated token has only the ACLs granted to it, root-only changes are refused, and
tasks run (`running`, then `stopped`) under the token's name."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from proxmoxer import ProxmoxAPI, ResourceException

from tests.twin.pve_helpers import FakeSupervisor, fake_node, make_root, run, write_conf
from twin.pve import access, api, tasks

CT200 = "arch: amd64\ncores: 8\ndev0: /dev/nvidia0,gid=44\nhostname: ct200\nmemory: 4096\n"
CT200 += "lxc.cgroup2.devices.allow: c 195:* rwm\n"
TOKEN = "root@pam!gpuhost"


@pytest.fixture(autouse=True)
def quick_auth_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api.ApiServer, "auth_delay", 0.2)  # Proxmox waits 3 s


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, int, str]]:
    root = make_root(tmp_path)
    write_conf(root, "lxc", 200, CT200)
    write_conf(root, "qemu", 129, "cores: 4\nmemory: 8192\nname: vm129\n")
    secret = api.create_token(root, "root@pam", "gpuhost")
    for path, role in access.GPUHOST_TOKEN_ACLS:  # what a profiled twin grants its token
        access.grant(root, path, role, TOKEN)
    server, thread = api.serve_in_thread(root, "127.0.0.1", 0)
    yield root, server.server_address[1], secret
    server.shutdown()
    server.server_close()
    thread.join()


def client(root: Path, port: int, secret: str, user: str = "root@pam", token: str = "gpuhost"):
    return ProxmoxAPI(
        "127.0.0.1",
        port=port,
        user=user,
        token_name=token,
        token_value=secret,
        verify_ssl=str(root / "etc/pve/pve-root-ca.pem"),  # the twin's own certificate
    )


def wait(px: ProxmoxAPI, upid: str) -> dict[str, object]:
    for _ in range(200):
        status = px.nodes("pve1").tasks(upid).status.get()
        if status["status"] == "stopped":
            return status
        time.sleep(0.05)
    raise AssertionError(f"task {upid} did not stop")


def test_reads_through_proxmoxer(served: tuple[Path, int, str]) -> None:
    px = client(*served)
    assert px.version.get()["release"] == "8.4"
    assert [n["node"] for n in px.nodes.get()] == ["pve1"]
    (ct,) = px.nodes("pve1").lxc.get()
    assert (ct["vmid"], ct["name"], ct["status"]) == (200, "ct200", "stopped")
    conf = px.nodes("pve1").lxc(200).config.get()
    assert conf["dev0"] == "/dev/nvidia0,gid=44" and conf["cores"] == 8
    assert conf["lxc"] == [["lxc.cgroup2.devices.allow", "c 195:* rwm"]]
    assert px.nodes("pve1").qemu(129).config.get()["name"] == "vm129"
    assert px.nodes("pve1").lxc(200).status.current.get()["status"] == "stopped"


def test_a_privsep_token_without_acls_sees_nothing(served: tuple[Path, int, str]) -> None:
    root, port, _ = served
    secret = access.add_token(root, "root@pam", "bare")  # privsep=1, like pveum's default
    px = client(root, port, secret, token="bare")
    assert px.nodes("pve1").qemu.get() == [] and px.nodes("pve1").lxc.get() == []
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").qemu(129).config.get()
    assert exc.value.status_code == 403
    assert exc.value.content == "Permission check failed (/vms/129, VM.Audit)"
    with pytest.raises(ResourceException, match="403"):
        px.nodes("pve1").qemu(129).status.start.post()
    access.grant(root, "/vms/129", "PVEAuditor", "root@pam!bare", propagate=False)
    assert [g["vmid"] for g in px.nodes("pve1").qemu.get()] == [129]
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").qemu(129).config.put(cores=2)
    assert exc.value.content.startswith("Permission check failed (/vms/129, VM.Config.Disk|")


def test_without_privsep_a_token_has_its_users_rights(served: tuple[Path, int, str]) -> None:
    root, port, _ = served
    secret = access.add_token(root, "root@pam", "full", privsep=False)
    px = client(root, port, secret, token="full")
    assert {g["vmid"] for g in px.nodes("pve1").qemu.get()} == {129}
    # ...but it is still not root@pam: raw PCI passthrough stays root-only
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").qemu(129).config.put(hostpci0="0000:01:00,pcie=1")
    assert exc.value.status_code == 500
    assert exc.value.content == "only root can set 'hostpci0' config for non-mapped devices"


def test_token_refusals_where_proxmox_wants_root(served: tuple[Path, int, str]) -> None:
    root, port, secret = served
    px = client(root, port, secret)
    px.nodes("pve1").qemu(129).config.put(machine="q35", cores=8)  # VM.Config.HWType/CPU: fine
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").qemu(129).config.put(hostpci0="0000:01:00,pcie=1")
    assert (exc.value.status_code, exc.value.content) == (
        500,
        "only root can set 'hostpci0' config for non-mapped devices",
    )
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").lxc(200).config.put(dev1="/dev/null")
    assert exc.value.status_code == 403
    assert exc.value.content == (
        "Permission check failed (configuring device passthrough is only allowed for root@pam)"
    )
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").lxc(200).config.put(delete="dev0")  # deleting one is root-only too
    assert exc.value.status_code == 403
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").qemu(129).config.put(cores=2, skiplock=1)
    assert exc.value.errors == {"skiplock": "Only root may use this option."}
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").qemu(129).config.put(args="-foo")
    assert exc.value.content == "only root can set 'args' config"
    # root@pam (pvesh over the deploy's SSH connection) may do all of it
    rc, _, err = run(root, "pvesh", "set", "/nodes/pve1/qemu/129/config", "--hostpci0", "01:00")
    assert rc == 0, err
    with pytest.raises(ResourceException) as exc:  # a token can neither replace nor delete it
        px.nodes("pve1").qemu(129).config.put(delete="hostpci0")
    assert exc.value.content == "only root can set 'hostpci0' config for non-mapped devices"
    text = (root / "etc/pve/qemu-server/129.conf").read_text()
    assert "hostpci0: 01:00\n" in text and "machine: q35\n" in text
    assert run(root, "qm", "config", "129")[1] == text  # pct/qm/pvesh see the same config


def test_post_config_errors_before_and_inside_the_worker(served: tuple[Path, int, str]) -> None:
    root, port, secret = served
    px = client(root, port, secret)
    vm = px.nodes("pve1").qemu(129)
    with pytest.raises(ResourceException) as exc:
        vm.config.post(cores=2, digest="0" * 40)
    assert (exc.value.status_code, exc.value.content) == (
        500,
        "checksum mismatch (file change by other user?)",
    )
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").qemu(999).config.post(cores=2)
    assert (
        exc.value.content == "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist"
    )
    upid = vm.config.post(hostpci0="0000:01:00")  # the per-key check is inside the worker
    assert tasks.UPID_RE.fullmatch(upid) and f":qmconfig:129:{TOKEN}:" in upid
    status = wait(px, upid)
    assert status["exitstatus"] == "only root can set 'hostpci0' config for non-mapped devices"
    log = px.nodes("pve1").tasks(upid).log.get()
    assert log[-1] == {"n": len(log), "t": f"TASK ERROR: {status['exitstatus']}"}
    with pytest.raises(ResourceException) as exc:  # a failed task within the delay: an error
        vm.config.post(hostpci1="0000:02:00", background_delay=5)
    assert exc.value.content == (
        "failed to update VM 129: only root can set 'hostpci1' config for non-mapped devices"
    )
    assert vm.config.post(cores=3, background_delay=5) is None  # finished OK within the delay
    assert vm.config.get()["cores"] == 3
    with pytest.raises(ResourceException) as exc:
        vm.config.put(cores=2, background_delay=5)  # PUT does not take it
    assert "background_delay" in exc.value.errors
    write_conf(root, "qemu", 129, "cores: 4\nlock: backup\n")
    with pytest.raises(ResourceException) as exc:
        vm.config.post(cores=2)
    assert exc.value.content == "VM is locked (backup)"


def test_tasks_run_and_fail_inside(served: tuple[Path, int, str]) -> None:
    root, port, secret = served
    px = client(root, port, secret)
    vm = px.nodes("pve1").qemu(129)
    upid = vm.status.start.post()
    assert f":qmstart:129:{TOKEN}:" in upid  # the caller is the token, not root@pam
    first = px.nodes("pve1").tasks(upid).status.get()
    assert first["status"] == "running" and "exitstatus" not in first
    assert wait(px, upid)["exitstatus"] == "OK"
    assert vm.status.current.get()["qmpstatus"] == "running"
    again = vm.status.start.post()  # a UPID, and the task fails (not an HTTP error)
    assert wait(px, again)["exitstatus"] == "VM 129 already running"
    missing = px.nodes("pve1").qemu(999).status.start.post()
    assert wait(px, missing)["exitstatus"] == (
        "Configuration file 'nodes/pve1/qemu-server/999.conf' does not exist"
    )
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").tasks("UPID:pve1:00000001:00000002:00000003:qmstart:1:x@pam:").status.get()
    assert exc.value.status_code == 400 and exc.value.errors == {"upid": "no such task"}
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").tasks("garbage").status.get()
    assert exc.value.errors == {"upid": "unable to parse worker upid"}
    # another token without Sys.Audit may not read this token's tasks
    other = client(root, port, access.add_token(root, "root@pam", "other"), token="other")
    with pytest.raises(ResourceException) as exc:
        other.nodes("pve1").tasks(upid).status.get()
    assert exc.value.content == "Permission check failed (/nodes/pve1, Sys.Audit)"


def test_shutdown_and_reboot(served: tuple[Path, int, str]) -> None:
    root, port, secret = served
    px = client(root, port, secret)
    vm = px.nodes("pve1").qemu(129)
    with pytest.raises(ResourceException, match="VM 129 not running"):
        vm.status.reboot.post()
    wait(px, vm.status.start.post())
    px.nodes("pve1").qemu(129).config.put(machine="q35")  # pending: the VM runs
    assert "machine" not in px.nodes("pve1").qemu(129).config.get(current=1)
    assert wait(px, vm.status.reboot.post())["exitstatus"] == "OK"
    current = vm.status.current.get()
    assert current["status"] == "running" and current["running-machine"].startswith("pc-q35-")
    from twin.pve import guest_state

    guest_state.set_acpi_ignored(root, 129)  # the guest ignores the ACPI powerdown
    status = wait(px, vm.status.shutdown.post(timeout=1))
    assert status["exitstatus"] == "VM quit/powerdown failed - got timeout"
    assert vm.status.current.get()["status"] == "running"
    status = wait(px, vm.status.shutdown.post(timeout=1, forceStop=1))
    assert status["exitstatus"] == "WARNINGS: 1"  # "VM still running - terminating now ..."
    assert vm.status.current.get()["status"] == "stopped"
    assert wait(px, vm.status.stop.post())["exitstatus"] == "OK"  # stopping a stopped VM: OK
    with pytest.raises(ResourceException, match="CT 200 not running"):
        px.nodes("pve1").lxc(200).status.shutdown.post()


def test_auth_failures(served: tuple[Path, int, str]) -> None:
    root, port, secret = served
    url = f"https://127.0.0.1:{port}/api2/json/version"
    ca = str(root / "etc/pve/pve-root-ca.pem")
    answer = requests.get(url, verify=ca, timeout=5)
    assert (answer.status_code, answer.reason, answer.content) == (401, "No ticket", b"")
    for header in (
        "PVEAPIToken=root@pam!gpuhost=not-the-secret",
        "PVEAPIToken=root@pam!other=whatever",
        "PVEAPIToken=nobody@pve!gpuhost=" + secret,
    ):
        answer = requests.get(url, headers={"Authorization": header}, verify=ca, timeout=5)
        assert (answer.status_code, answer.reason, answer.content) == (
            401,
            "Authentication failed!",
            b"",
        )
    with pytest.raises(ResourceException) as exc:
        client(root, port, "not-the-secret").version.get()
    assert exc.value.status_code == 401
    cfg = access.load(root)
    cfg.users["root@pam"].tokens["gpuhost"].expire = int(time.time()) - 1
    access.save(root, cfg)
    with pytest.raises(ResourceException, match="401"):
        client(root, port, secret).version.get()


def test_error_bodies_carry_the_message(served: tuple[Path, int, str]) -> None:
    root, port, secret = served
    url = f"https://127.0.0.1:{port}/api2/json/nodes/pve1/lxc/200/config"
    auth = {"Authorization": f"PVEAPIToken={TOKEN}={secret}"}
    ca = str(root / "etc/pve/pve-root-ca.pem")
    answer = requests.put(url, data={"foo": "bar"}, headers=auth, verify=ca, timeout=5)
    body = json.loads(answer.content)
    assert answer.status_code == 400 and body["data"] is None and "foo" in body["errors"]
    assert body["message"].startswith("400 Parameter verification failed.")
    # a repeated key is an array: joined for '-list' formats, refused anywhere else
    answer = requests.put(url, data=[("cores", "2"), ("cores", "3")], headers=auth, verify=ca,
                          timeout=5)  # fmt: skip
    assert json.loads(answer.content)["errors"] == {
        "cores": "type check ('string') failed - got ARRAY"
    }


def test_tokens_file_format_and_replacement(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    first = api.create_token(root, "root@pam", "ci")
    second = api.create_token(root, "root@pam", "ci")
    path = root / "etc/pve/priv/token.cfg"
    assert path.read_text() == f"root@pam!ci {second}\n" and first != second
    assert path.stat().st_mode & 0o777 == 0o600
    assert api.load_tokens(path) == {"root@pam!ci": second}
    assert "token:root@pam!ci:0:1::\n" in (root / "etc/pve/user.cfg").read_text()
    with pytest.raises(ValueError):
        api.create_token(root, "root", "ci")
    with pytest.raises(ValueError, match="no such user"):
        api.create_token(root, "ci@pve", "x1")
    assert os.stat(path.parent).st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_container_power_tasks(served: tuple[Path, int, str]) -> None:
    root, port, secret = served
    px = client(root, port, secret)
    ct = px.nodes("pve1").lxc(200)
    sup = FakeSupervisor(root)
    try:
        fake_node(root, "/dev/nvidia0")
        assert wait(px, ct.status.start.post())["exitstatus"] == "OK"
        with pytest.raises(ResourceException, match="CT 200 already running"):
            ct.status.start.post()  # checked before the worker: an HTTP error
        assert wait(px, ct.status.reboot.post())["exitstatus"] == "OK"
        assert [r["op"] for r in sup.seen] == ["ct-start", "ct-stop", "ct-start"]
        upid = ct.status.shutdown.post(timeout=5)
        assert f":vzshutdown:200:{TOKEN}:" in upid and wait(px, upid)["exitstatus"] == "OK"
        assert ct.status.current.get()["status"] == "stopped"
        sup.fail_start = "startup for container '200' failed"
        assert wait(px, ct.status.start.post())["exitstatus"] == sup.fail_start
    finally:
        sup.close()
