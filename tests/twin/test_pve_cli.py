"""pct, qm and pvesh of the twin: output formats and rejections (docs/reference/formats.md §2-§4)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.twin.pve_helpers import (
    FakeSupervisor,
    fake_node,
    make_hw_root,
    make_root,
    run,
    run_shim,
    write_conf,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")

CT200 = """\
arch: amd64
cores: 8
dev0: /dev/nvidia0,gid=44
hostname: ct200
memory: 4096
rootfs: local-zfs:subvol-200-disk-0,size=64G
lxc.cgroup2.devices.allow: c 195:* rwm
"""
VM129 = """\
boot: order=scsi0
cores: 4
memory: 8192
name: vm129
scsi0: local-zfs:vm-129-disk-0,size=32G
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = make_root(tmp_path)
    write_conf(root, "lxc", 200, CT200)
    write_conf(root, "qemu", 129, VM129)
    return root


@pytest.fixture
def supervisor(root: Path) -> Iterator[FakeSupervisor]:
    sup = FakeSupervisor(root)
    yield sup
    sup.close()


def conf_text(root: Path, kind: str, vmid: int) -> str:
    sub = "lxc" if kind == "lxc" else "qemu-server"
    return (root / "etc/pve" / sub / f"{vmid}.conf").read_text()


def mark_running(root: Path, ctid: int) -> None:
    state = root / "run/gpuhost-twin/ct" / f"{ctid}.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text('{"status": "running"}\n')


# --- pct ---


def test_pct_list_format(root: Path) -> None:
    write_conf(root, "lxc", 101, "arch: amd64\nlock: backup\n")
    rc, out, err = run(root, "pct", "list")
    assert (rc, err) == (0, "")
    assert out == (
        "VMID       Status     Lock         Name                \n"
        "101        stopped    backup       CT101               \n"
        "200        stopped                 ct200               \n"
    )


def test_pct_list_prints_nothing_without_containers(tmp_path: Path) -> None:
    assert run(make_root(tmp_path), "pct", "list") == (0, "", "")


def test_pct_config_sorted_raw_last_pending_merged(root: Path) -> None:
    write_conf(root, "lxc", 200, CT200 + "\n[pve:pending]\ncores: 16\ndelete: dev0\n")
    rc, out, _ = run(root, "pct", "config", "200")
    assert rc == 0
    assert out == (
        "arch: amd64\ncores: 16\nhostname: ct200\nmemory: 4096\n"
        "rootfs: local-zfs:subvol-200-disk-0,size=64G\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
    )
    rc, out, _ = run(root, "pct", "config", "200", "--current")
    assert "cores: 8\ndev0: /dev/nvidia0,gid=44\n" in out
    assert run(root, "pct", "config", "200", "--current", "1")[1] == out


@needs_root
def test_pct_set_dev_on_stopped_ct_applies_and_orders(root: Path) -> None:
    fake_node(root, "/dev/nvidia1")
    rc, out, err = run(
        root, "pct", "set", "200", "-dev10", "/dev/nvidia1", "-dev2", "/dev/nvidia1,mode=0666"
    )
    assert (rc, out, err) == (0, "", "")
    text = conf_text(root, "lxc", 200)
    assert "dev0: /dev/nvidia0,gid=44\ndev10: /dev/nvidia1\ndev2: /dev/nvidia1,mode=0666\n" in text
    assert text.endswith("lxc.cgroup2.devices.allow: c 195:* rwm\n")
    assert run(root, "pct", "set", "200", "-delete", "dev10,dev2") == (0, "", "")
    assert "dev10" not in conf_text(root, "lxc", 200)


@needs_root
def test_pct_set_dev_on_running_ct_goes_to_pending(root: Path) -> None:
    fake_node(root, "/dev/nvidia1")
    mark_running(root, 200)
    assert run(root, "pct", "set", "200", "-dev1", "/dev/nvidia1", "-memory", "8192")[0] == 0
    text = conf_text(root, "lxc", 200)
    assert "memory: 8192\n" in text.split("[pve:pending]")[0]  # hotplugged
    assert text.endswith("\n[pve:pending]\ndev1: /dev/nvidia1\n")
    _rc, out, _ = run(root, "pct", "pending", "200")
    assert "new dev1: /dev/nvidia1\n" in out and "cur memory: 8192\n" in out


def test_pct_set_missing_device_node(root: Path) -> None:
    rc, out, err = run(root, "pct", "set", "200", "-dev1", "/dev/nvidia-uvm")
    assert (rc, out, err) == (255, "", "Device /dev/nvidia-uvm does not exist\n")
    assert conf_text(root, "lxc", 200) == CT200


def test_pct_set_rejections(root: Path) -> None:
    rc, _, err = run(root, "pct", "set", "200", "-foo", "bar")
    assert rc == 255
    assert err == "Unknown option: foo\n400 unable to parse option\npct set <vmid> [OPTIONS]\n"
    rc, _, err = run(root, "pct", "set", "200", "-dev1", "/dev/nvidia1,mode=777")
    assert rc == 255
    assert err == (
        "400 Parameter verification failed.\n"
        "dev1: invalid format - format error\n"
        "dev1.mode: value does not match the regex pattern\n\n"
        "pct set <vmid> [OPTIONS]\n"
    )
    rc, _, err = run(root, "pct", "set", "200", "-memory", "8")
    assert err.startswith(
        "400 Parameter verification failed.\nmemory: value must have a minimum value of 16\n"
    )
    rc, _, err = run(root, "pct", "set", "200", "-lxc.cgroup2.devices.allow", "c 195:* rwm")
    assert err.startswith("Unknown option: lxc.cgroup2.devices.allow\n400 unable to parse option\n")
    rc, _, err = run(root, "pct", "set", "200", "-delete", "nosuchkey")
    assert err.startswith(
        "400 Parameter verification failed.\ndelete: unknown option 'nosuchkey'\n"
    )
    rc, _, err = run(root, "pct", "set", "200", "-delete", "memory")
    assert (rc, err) == (255, "unable to delete required option 'memory'\n")
    rc, _, err = run(root, "pct", "set", "200", "-delete", "dev5")
    assert (rc, err) == (0, "cannot delete 'dev5' - not set in current configuration!\n")
    rc, _, err = run(root, "pct", "set", "200")
    assert (rc, err) == (255, "no options specified\n")
    assert conf_text(root, "lxc", 200) == CT200


def test_pct_bad_vmid_and_missing_ct(root: Path) -> None:
    rc, _, err = run(root, "pct", "config", "abc")
    assert rc == 255
    assert err.startswith(
        "400 Parameter verification failed.\nvmid: type check ('integer') failed - got 'abc'"
    )
    rc, _, err = run(root, "pct", "config", "999")
    assert (rc, err) == (255, "Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n")
    rc, _, err = run(root, "pct", "config")
    assert (rc, err) == (255, "400 not enough arguments\npct config <vmid> [OPTIONS]\n")


def test_pct_start_without_supervisor_fails_clearly(root: Path) -> None:
    rc, _, err = run(root, "pct", "start", "200")
    assert rc == 255
    assert "no supervisor serves /run/gpuhost-twin/requests" in err


def test_pct_start_stop_status_exec_through_supervisor(
    root: Path, supervisor: FakeSupervisor
) -> None:
    write_conf(root, "lxc", 200, CT200 + "\n[pve:pending]\ncores: 16\n")
    assert run(root, "pct", "status", "200") == (0, "status: stopped\n", "")
    assert run(root, "pct", "start", "200") == (0, "", "")
    assert supervisor.seen == [{"op": "ct-start", "ctid": 200}]
    assert "[pve:pending]" not in conf_text(root, "lxc", 200)  # a start applies pending changes
    assert "cores: 16" in conf_text(root, "lxc", 200)
    assert run(root, "pct", "status", "200") == (0, "status: running\n", "")
    assert run(root, "pct", "start", "200") == (255, "", "CT 200 already running\n")
    assert run(root, "pct", "exec", "200", "--", "nvidia-smi", "-L") == (3, "ran nvidia-smi -L", "")
    assert run(root, "pct", "stop", "200") == (0, "", "")
    assert run(root, "pct", "stop", "200") == (255, "", "CT 200 not running\n")
    assert run(root, "pct", "exec", "200", "--", "true") == (
        255,
        "",
        "container '200' not running!\n",
    )


def test_pct_start_failure_is_passed_through(root: Path, supervisor: FakeSupervisor) -> None:
    supervisor.fail_start = "Device /dev/nvidia0 does not exist\n"
    assert run(root, "pct", "start", "200") == (255, "", "Device /dev/nvidia0 does not exist\n")


# --- qm ---


def test_qm_list_format(root: Path) -> None:
    rc, out, err = run(root, "qm", "list")
    assert (rc, err) == (0, "")
    assert out == (
        "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID       \n"
        "       129 vm129                stopped    8192              32.00 0         \n"
    )


def test_qm_set_hostpci_prints_update_and_applies(root: Path) -> None:
    rc, out, err = run(
        root, "qm", "set", "129", "--hostpci0", "0000:01:00,pcie=1", "--machine", "q35"
    )
    assert (rc, err) == (0, "")
    assert out == "update VM 129: -hostpci0 0000:01:00,pcie=1 -machine q35\n"
    assert "hostpci0: 0000:01:00,pcie=1\nmachine: q35\n" in conf_text(root, "qemu", 129)
    assert (
        run(root, "qm", "set", "129", "--delete", "hostpci0")[1]
        == "update VM 129: -delete hostpci0\n"
    )
    assert "hostpci0" not in conf_text(root, "qemu", 129)


def test_qm_set_rejections(root: Path) -> None:
    rc, _, err = run(root, "qm", "set", "129", "--hostpci0", "0000:C1:00")
    assert rc == 255
    assert err == (
        "400 Parameter verification failed.\nhostpci0: invalid format - format error\n"
        "hostpci0.host: value does not match the regex pattern\n\nqm set <vmid> [OPTIONS]\n"
    )
    rc, _, err = run(root, "qm", "set", "129", "--machine", "q99")
    assert "machine.type: value does not match the regex pattern" in err
    rc, _, err = run(root, "qm", "set", "129", "--hostpci16", "0000:01:00")
    assert err.startswith("Unknown option: hostpci16\n")


Q35_AT = " at /usr/share/perl5/PVE/QemuServer/PCI.pm line 501."


def test_qm_start_refuses_pcie_without_q35(tmp_path: Path) -> None:
    root = make_hw_root(tmp_path)
    write_conf(root, "qemu", 129, VM129)
    assert run(root, "qm", "set", "129", "--hostpci0", "0000:01:00,pcie=1")[0] == 0  # set accepts
    assert run(root, "qm", "start", "129") == (
        255,
        "",
        f"q35 machine model is not enabled{Q35_AT}\n",
    )
    assert run(root, "qm", "status", "129") == (0, "status: stopped\n", "")


def test_qm_start_checks_host_pci_devices(tmp_path: Path) -> None:
    root = make_hw_root(tmp_path)
    write_conf(root, "qemu", 129, VM129)
    run(root, "qm", "set", "129", "--hostpci0", "0000:05:00,pcie=1", "--machine", "q35")
    assert run(root, "qm", "start", "129") == (255, "", "no PCI device found for '0000:05:00'\n")
    run(root, "qm", "set", "129", "--hostpci0", "0000:41:00,pcie=1")
    assert run(root, "qm", "start", "129") == (0, "", "")
    assert run(root, "qm", "start", "129") == (255, "", "VM 129 already running\n")


def test_qm_set_on_running_vm_goes_to_PENDING(tmp_path: Path) -> None:
    root = make_hw_root(tmp_path)
    write_conf(root, "qemu", 129, VM129)
    run(root, "qm", "set", "129", "--machine", "q35")
    assert run(root, "qm", "start", "129") == (0, "", "")
    assert run(root, "qm", "start", "129") == (255, "", "VM 129 already running\n")
    run(root, "qm", "set", "129", "--hostpci0", "0000:01:00,pcie=1", "--name", "gpu-vm")
    text = conf_text(root, "qemu", 129)
    assert "name: gpu-vm\n" in text.split("[PENDING]")[0]  # fast-plug option
    assert text.endswith("\n[PENDING]\nhostpci0: 0000:01:00,pcie=1\n")
    _rc, out, _ = run(root, "qm", "list", "--full")
    assert "running" in out and "100129" in out
    assert run(root, "qm", "stop", "129") == (0, "", "")
    assert run(root, "qm", "stop", "129") == (0, "", "")  # vm_stop returns quietly
    assert run(root, "qm", "start", "129")[0] == 0  # applies pending
    assert "[PENDING]" not in conf_text(root, "qemu", 129)


# --- pvesh ---


def test_pvesh_lxc_list_json(root: Path) -> None:
    rc, out, err = run(root, "pvesh", "get", "/nodes/pve1/lxc", "--output-format", "json")
    assert (rc, err) == (0, "")
    assert out.endswith("\n") and out.count("\n") == 1
    (ct,) = json.loads(out)
    assert out == json.dumps([ct], sort_keys=True, separators=(",", ":")) + "\n"  # canonical
    assert ct["vmid"] == 200 and ct["type"] == "lxc" and ct["status"] == "stopped"
    assert ct["maxmem"] == 4096 * 1024 * 1024 and ct["maxdisk"] == 64 * 1024**3


def test_pvesh_config_types_and_raw_keys(root: Path) -> None:
    rc, out, err = run(
        root, "pvesh", "get", "/nodes/pve1/lxc/200/config", "--output-format", "json"
    )
    assert (rc, err) == (0, "")
    data = json.loads(out)
    assert data["cores"] == 8 and data["memory"] == 4096  # integers as JSON numbers
    assert data["dev0"] == "/dev/nvidia0,gid=44"
    assert data["lxc"] == [["lxc.cgroup2.devices.allow", "c 195:* rwm"]]
    assert len(data["digest"]) == 40


def test_pvesh_set_is_silent_and_validates(root: Path) -> None:
    args = ["set", "/nodes/pve1/lxc/200/config", "-cores", "4", "--output-format", "json"]
    assert run(root, "pvesh", *args) == (0, "", "")  # proxmoxer: stderr must stay empty
    assert "cores: 4\n" in conf_text(root, "lxc", 200)
    rc, _, err = run(root, "pvesh", "set", "/nodes/pve1/lxc/200/config", "-bogus", "1")
    assert rc == 255 and err.startswith("Unknown option: bogus\n400 unable to parse option\n")
    rc, _, err = run(root, "pvesh", "get", "/nodes/pve1/nothing", "--output-format", "json")
    assert (rc, err) == (255, "No 'get' handler defined for '/nodes/pve1/nothing'\n")


def test_pvesh_version_nodes_and_qemu_status(root: Path) -> None:
    version = json.loads(run(root, "pvesh", "get", "/version", "--output-format", "json")[1])
    assert set(version) == {"version", "release", "repoid"}
    (node,) = json.loads(run(root, "pvesh", "get", "/nodes", "--output-format", "json")[1])
    assert node["node"] == "pve1" and node["status"] == "online"
    rc, out, _ = run(
        root, "pvesh", "create", "/nodes/pve1/qemu/129/status/start", "--output-format", "json"
    )
    upid = json.loads(out)
    assert rc == 0 and upid.startswith("UPID:pve1:") and ":qmstart:129:root@pam:" in upid
    task = json.loads(
        run(root, "pvesh", "get", f"/nodes/pve1/tasks/{upid}/status", "--output-format", "json")[1]
    )
    assert (task["status"], task["exitstatus"]) == ("stopped", "OK")
    status = json.loads(
        run(root, "pvesh", "get", "/nodes/pve1/qemu/129/status/current", "--output-format", "json")[
            1
        ]
    )
    assert status["status"] == "running" and status["running-machine"].startswith("pc-i440fx-")


def test_pvesh_qemu_set_prints_update_line(root: Path) -> None:
    rc, out, err = run(root, "pvesh", "set", "/nodes/pve1/qemu/129/config", "-cores", "8")
    assert (rc, out, err) == (0, "update VM 129: -cores 8\n", "")


def test_pvesh_create_and_delete_vm(root: Path) -> None:
    rc, _out, err = run(root, "pvesh", "create", "/nodes/pve1/qemu", "-vmid", "300", "-name", "new",
                       "-scsi0", "local-lvm:32", "--output-format", "json")  # fmt: skip
    assert (rc, err) == (0, "")
    text = conf_text(root, "qemu", 300)
    assert "name: new\n" in text and "scsi0: local-lvm:vm-300-disk-0,size=32G\n" in text
    rc, _, err = run(root, "pvesh", "create", "/nodes/pve1/qemu", "-vmid", "300")
    assert (rc, err) == (255, "unable to create VM 300 - VM 300 already exists on node 'pve1'\n")
    assert run(root, "pvesh", "delete", "/nodes/pve1/qemu/300", "--output-format", "json")[0] == 0
    assert not (root / "etc/pve/qemu-server/300.conf").exists()


def test_installed_shims_run_as_processes(root: Path) -> None:
    res = run_shim(root, "pct", "list")
    assert (res.returncode, res.stderr) == (0, "")
    assert res.stdout.startswith("VMID       Status")
    res = run_shim(root, "pvesh", "get", "/nodes/pve1/qemu", "--output-format", "json")
    assert json.loads(res.stdout)[0]["vmid"] == 129
    res = run_shim(root, "qm", "set", "129", "--foo", "1")
    assert res.returncode == 255 and res.stderr.startswith("Unknown option: foo")


def test_parse_warnings_go_to_stderr(root: Path) -> None:
    write_conf(root, "lxc", 101, "arch: amd64\nfoo: bar\n")
    rc, out, err = run(root, "pct", "config", "101")
    assert (rc, out) == (0, "arch: amd64\nfoo: bar\n")  # pve-container keeps the value
    assert err == "vm 101 - unable to parse value of 'foo' - unknown setting 'foo'\n"
    rc, _, err = run(root, "pvesh", "get", "/nodes/pve1/lxc/101/config", "--output-format", "json")
    assert rc == 0 and err.startswith("vm 101 - unable to parse value of 'foo'")  # proxmoxer: error
