"""Stop and start order around a reboot, the record, and the pct/qm list parser."""

from __future__ import annotations

import pytest

from gpuhost.observe.guest_status import parse_guest_lists
from gpuhost.observe.proxmox import parse_pve_configs
from gpuhost.plan.guests.power import (
    Startup,
    StartupFormatError,
    guests_from_configs,
    parse_record,
    parse_startup,
    plan_guest_power,
)

# docs/reference/formats.md §2/§3: pct list "%-10s %-10s %-12s %-20s", qm list "%10s %-20s %-10s %-10s %12s %-10s"
LISTS = [
    "==> lxc <==",
    "VMID       Status     Lock         Name                ",
    "101        running                 gpu-ct              ",
    "102        stopped    backup       a-name-longer-than-twenty-chars",
    "103        running                 CT103               ",
    "==> qemu <==",
    "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID       ",
    "       100 vm100                running    8192              32.00 100100    ",
    "       129                      stopped    2048               0.00 0         ",
]
CONFIGS = [
    "==> /etc/pve/lxc/101.conf <==",
    "onboot: 1",
    "startup: order=2",
    "==> /etc/pve/lxc/102.conf <==",
    "startup: 1,up=5",
    "==> /etc/pve/lxc/103.conf <==",
    "hostname: ct103",
    "==> /etc/pve/qemu-server/100.conf <==",
    "startup: order=2,down=60",
]


def test_lists_parse_status_per_guest() -> None:
    assert parse_guest_lists(LISTS) == {
        ("lxc", 101): "running",
        ("lxc", 102): "stopped",
        ("lxc", 103): "running",
        ("qemu", 100): "running",
        ("qemu", 129): "stopped",
    }
    assert parse_guest_lists(["==> lxc <==", "==> qemu <=="]) == {}  # no guests: no headers


def test_startup_grammar() -> None:
    assert parse_startup("order=2,up=30,down=60") == Startup(2, 30, 60)
    assert parse_startup("3") == Startup(order=3)
    assert parse_startup("") == Startup()
    for bad in ("order=x", "up=1,2", "order=1,order=2", "late=1"):
        with pytest.raises(StartupFormatError):
            parse_startup(bad)


def test_stop_reverses_start_order_and_unordered_come_last() -> None:
    guests = guests_from_configs(parse_pve_configs(CONFIGS))
    statuses = {g: "running" for g in guests}
    power = plan_guest_power(guests, statuses, set(), rebooting=True)
    assert [g.word for g in power.start] == ["CT 102", "VM 100", "CT 101", "CT 103"]
    assert [g.word for g in power.stop] == ["CT 103", "CT 101", "VM 100", "CT 102"]
    assert parse_record(power.record) == set(statuses)


def test_nothing_running_no_record_is_nothing_to_do() -> None:
    guests = guests_from_configs(parse_pve_configs(CONFIGS))
    power = plan_guest_power(guests, {("lxc", 101): "stopped"}, set(), rebooting=True)
    assert (power.stop, power.start, power.record) == ([], [], "")


def test_a_killed_runs_record_is_brought_back_without_a_reboot() -> None:
    guests = guests_from_configs(parse_pve_configs(CONFIGS))
    statuses = {("lxc", 103): "running"}
    power = plan_guest_power(guests, statuses, {("lxc", 102), ("lxc", 999)}, rebooting=False)
    assert power.stop == []  # no reboot: nothing is stopped
    assert [g.word for g in power.start] == ["CT 102"]  # 999's config is gone


def test_record_rejects_foreign_lines() -> None:
    with pytest.raises(ValueError, match="unexpected line"):
        parse_record("lxc 101\nrm -rf /\n")
