"""startall / stopall of the twin's API (pve-manager Nodes.pm): who is started or stopped, and
in which order (ascending startup order, guests without one last; stopall the reverse).

VMs only: they are state in the twin, so no supervisor is needed. `up=0` everywhere keeps
startall's default 3 s pause between VMs out of the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.twin.pve_helpers import make_root, run, write_conf
from twin.pve import startstop, tasks

# vmid -> config: two ordered (out of vmid order), two without order, one not onboot
VMS = {
    100: "onboot: 1\nstartup: order=5,up=0\n",
    101: "onboot: 1\nstartup: up=0\n",
    102: "onboot: 1\nstartup: 1,up=0,down=30\n",
    103: "startup: order=3,up=0\n",
    104: "onboot: 1\nstartup: up=0\n",
}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = make_root(tmp_path)
    for vmid, text in VMS.items():
        write_conf(root, "qemu", vmid, f"name: vm{vmid}\nmemory: 1024\n{text}")
    return root


def power_log(root: Path) -> list[tuple[str, int]]:
    path = root / startstop.POWER_LOG
    lines = path.read_text().splitlines() if path.exists() else []
    return [(line.split()[1], int(line.split()[3])) for line in lines]


def pvesh_create(root: Path, path: str, *args: str) -> dict[str, object]:
    rc, out, err = run(root, "pvesh", "create", path, *args, "--output-format", "json")
    assert rc == 0, err
    upid = json.loads(out)
    assert upid.startswith("UPID:pve1:") and f":{path.rsplit('/', 1)[1]}::" in upid
    return tasks.task_status(root, upid)


def test_startall_starts_onboot_guests_in_startup_order(root: Path) -> None:
    status = pvesh_create(root, "/nodes/pve1/startall")
    assert status["exitstatus"] == "OK"
    # order 1, order 5, then the unordered ones by vmid; 103 has no onboot
    assert power_log(root) == [("start", 102), ("start", 100), ("start", 101), ("start", 104)]


def test_startall_force_with_vms_starts_exactly_those(root: Path) -> None:
    pvesh_create(root, "/nodes/localhost/startall", "--force", "1", "--vms", "104,103 101")
    assert power_log(root) == [("start", 103), ("start", 101), ("start", 104)]
    # running guests are skipped, not restarted
    pvesh_create(root, "/nodes/localhost/startall", "--force", "1", "--vms", "101,102")
    assert power_log(root)[3:] == [("start", 102)]


def test_stopall_stops_running_guests_in_reverse_order(root: Path) -> None:
    pvesh_create(root, "/nodes/pve1/startall", "--force", "1")
    (root / startstop.POWER_LOG).unlink()
    status = pvesh_create(
        root, "/nodes/pve1/stopall", "--vms", "100,101,102,104", "--timeout", "60"
    )
    assert status["exitstatus"] == "OK"
    assert power_log(root) == [("stop", 104), ("stop", 101), ("stop", 100), ("stop", 102)]
    # 103 was not listed: still running; a second stopall finds nothing else to stop
    pvesh_create(root, "/nodes/pve1/stopall", "--vms", "100,101")
    assert power_log(root)[4:] == []
    assert run(root, "qm", "status", "103")[1] == "status: running\n"


def test_failed_start_is_a_warning_of_the_task(root: Path) -> None:
    write_conf(root, "qemu", 105, "hostpci0: 0000:01:00,pcie=1\nstartup: up=0\n")  # no such device
    rc, out, err = run(root, "pvesh", "create", "/nodes/pve1/startall", "--force", "1",
                       "--vms", "105,101", "--output-format", "json")  # fmt: skip
    assert rc == 0
    assert "Starting VM 105 failed: no PCI device found for '0000:01:00'" in err
    assert tasks.task_status(root, json.loads(out))["exitstatus"] == "WARNINGS: 1"
    assert power_log(root) == [("start", 101)]


def test_bad_parameters_are_refused(root: Path) -> None:
    rc, _, err = run(root, "pvesh", "create", "/nodes/pve1/stopall", "--vms", "abc")
    assert rc == 255 and "vms" in err
    rc, _, err = run(root, "pvesh", "create", "/nodes/pve1/stopall", "--timeout", "7201")
    assert rc == 255 and "timeout" in err
