"""Which guests stop and start, and in which order, is the Plan's (gpuhost/plan/phases.py
plan_power): around a reboot every running guest, in Proxmox's stop order and back in its start
order; without a reboot only the running guests whose GPU entries change. The deploys only
apply these (deploys/reboot.py, trial_boot.py, split.py)."""

from __future__ import annotations

from gpuhost.plan.make import Plan, make_plan
from tests.unit.hosts import kpro6, kpro6_raw
from tests.unit.test_plan import KPRO6, host, lxc
from tests.unit.test_plan_boot import files

CONFIGS = [
    "==> /etc/pve/lxc/101.conf <==",
    "onboot: 1",
    "startup: order=2",
    "==> /etc/pve/lxc/102.conf <==",
    "startup: order=1",
    "==> /etc/pve/lxc/200.conf <==",
    "unprivileged: 1",
]


def _plan(converged: bool, ct200: str = "stopped", recorded: str = "") -> Plan:
    raw = kpro6_raw()
    raw["PveGuestConfigs"] = (0, CONFIGS)
    listing = ["VMID Status Lock Name", "101 running a", "102 running b", f"200 {ct200} c"]
    raw["GuestStatuses"] = (0, ["==> lxc <==", *listing, "==> qemu <=="])
    managed = {"etc__kernel__cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet\n"}
    if recorded:
        managed["var__lib__gpuhost__guests_dash_before_dash_reboot"] = recorded
    raw["ConfigFiles"] = files(**managed)
    spec = host(KPRO6, lxc(200, "rest"))
    if converged:
        raw["KernelCmdline"] = (0, ["root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet iommu=pt"])
        raw["ModuleParameters"] = (0, ["nvidia_uvm uvm_disable_hmm Y"])
        spec = host(KPRO6, lxc(200, "rest"), modules={"uvm_disable_hmm": True})
    return make_plan("kpro6", spec, kpro6(**raw))


def _ids(guests: list) -> list[int]:
    return [g.vmid for g in guests]


def test_a_reboot_stops_every_running_guest_in_proxmox_order() -> None:
    plan = _plan(converged=False)
    assert plan.rebooting and plan.moving_guests is None
    assert plan.guest_power is not None
    assert _ids(plan.guest_power.stop) == [101, 102]  # order=2 stops first
    assert _ids(plan.guest_power.start) == [102, 101]
    assert plan.guest_power.record == "lxc 101\nlxc 102\n"


def test_without_a_reboot_only_the_guests_whose_gpus_move_stop() -> None:
    plan = _plan(converged=True, ct200="running")
    assert not plan.rebooting and plan.containers[200].changes_config
    assert plan.guest_power is not None and plan.guest_power.stop == []
    assert plan.moving_guests is not None
    assert _ids(plan.moving_guests.stop) == [200] and _ids(plan.moving_guests.start) == [200]


def test_an_earlier_runs_record_brings_its_guests_back() -> None:
    plan = _plan(converged=True, recorded="lxc 102\n")
    assert plan.guest_power is not None and _ids(plan.guest_power.start) == [102]
    assert plan.guest_power.stop == []
