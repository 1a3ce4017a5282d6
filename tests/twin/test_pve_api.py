"""The twin's Proxmox API over HTTPS, driven by the real proxmoxer client (formats.md §4)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from proxmoxer import ProxmoxAPI, ResourceException

from tests.twin.pve_helpers import make_root, run, write_conf
from twin.pve import api

CT200 = "arch: amd64\ncores: 8\ndev0: /dev/nvidia0,gid=44\nhostname: ct200\nmemory: 4096\n"
CT200 += "lxc.cgroup2.devices.allow: c 195:* rwm\n"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, int, str]]:
    root = make_root(tmp_path)
    write_conf(root, "lxc", 200, CT200)
    write_conf(root, "qemu", 129, "cores: 4\nmemory: 8192\nname: vm129\n")
    secret = api.create_token(root, "root@pam", "gpuhost")
    server, thread = api.serve_in_thread(root, "127.0.0.1", 0)
    yield root, server.server_address[1], secret
    server.shutdown()
    server.server_close()
    thread.join()


def client(root: Path, port: int, secret: str) -> ProxmoxAPI:
    return ProxmoxAPI(
        "127.0.0.1",
        port=port,
        user="root@pam",
        token_name="gpuhost",
        token_value=secret,
        verify_ssl=str(root / "etc/pve/pve-root-ca.pem"),  # the twin's own certificate
    )


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


def test_put_config_writes_the_same_files(served: tuple[Path, int, str]) -> None:
    root, port, secret = served
    px = client(root, port, secret)
    px.nodes("pve1").qemu(129).config.put(hostpci0="0000:01:00,pcie=1", machine="q35")
    text = (root / "etc/pve/qemu-server/129.conf").read_text()
    assert "hostpci0: 0000:01:00,pcie=1\nmachine: q35\n" in text
    assert run(root, "qm", "config", "129")[1] == text  # pct/qm/pvesh see the same config
    px.nodes("pve1").lxc(200).config.put(delete="dev0", cores=16)
    conf = px.nodes("pve1").lxc(200).config.get()
    assert "dev0" not in conf and conf["cores"] == 16


def test_put_config_rejections(served: tuple[Path, int, str]) -> None:
    px = client(*served)
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").lxc(200).config.put(foo="bar")
    assert exc.value.status_code == 400
    assert exc.value.errors == {
        "foo": "property is not defined in schema and the schema does not allow additional properties"
    }
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").qemu(129).config.put(hostpci0="0000:C1:00")
    assert exc.value.errors == {
        "hostpci0": "invalid format - format error\nhostpci0.host: value does not match the regex pattern\n"
    }
    with pytest.raises(ResourceException) as exc:
        px.nodes("pve1").lxc(999).config.get()
    assert exc.value.status_code == 500
    assert exc.value.content == "Configuration file 'nodes/pve1/lxc/999.conf' does not exist"


def test_tasks_for_vm_start(served: tuple[Path, int, str]) -> None:
    px = client(*served)
    upid = px.nodes("pve1").qemu(129).status.start.post()
    assert px.nodes("pve1").tasks(upid).status.get()["exitstatus"] == "OK"
    assert px.nodes("pve1").qemu(129).status.current.get()["qmpstatus"] == "running"
    with pytest.raises(ResourceException, match="VM 129 already running"):
        px.nodes("pve1").qemu(129).status.start.post()


def test_auth_failures(served: tuple[Path, int, str]) -> None:
    root, port, _ = served
    with pytest.raises(ResourceException) as exc:
        client(root, port, "not-the-secret").version.get()
    assert exc.value.status_code == 401
    url = f"https://127.0.0.1:{port}/api2/json/version"
    ca = str(root / "etc/pve/pve-root-ca.pem")
    assert requests.get(url, verify=ca, timeout=5).status_code == 401  # no token at all
    bad = {"Authorization": "PVEAPIToken=root@pam!other=whatever"}
    assert requests.get(url, headers=bad, verify=ca, timeout=5).status_code == 401


def test_tokens_file_format_and_replacement(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    first = api.create_token(root, "root@pam", "ci")
    second = api.create_token(root, "root@pam", "ci")
    path = root / "etc/pve/priv/token.cfg"
    assert path.read_text() == f"root@pam!ci {second}\n" and first != second
    assert path.stat().st_mode & 0o777 == 0o600
    assert api.load_tokens(path) == {"root@pam!ci": second}
    with pytest.raises(ValueError):
        api.create_token(root, "root", "ci")
