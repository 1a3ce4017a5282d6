"""The q35 rule (a VM that gets GPUs needs a q35 machine type: Proxmox refuses hostpciN pcie=1
on any other) is checked on three inputs: the spec's machine, the VM's config when the spec
leaves the machine to it (the plan), and the live config (the audit). One predicate
(gpuhost/spec/grammar.py machine_is_q35) decides all three; this test fails if one of them
drifts from it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from gpuhost.audit.guest_checks import vm_machine
from gpuhost.plan.make import make_plan
from gpuhost.plan.model import PlanError
from gpuhost.spec.grammar import machine_is_q35
from tests.unit.hosts import kpro6
from tests.unit.test_plan import KPRO6, host, lxc, vm
from tests.unit.test_vmplan import configs

MACHINES = ["q35", "pc-q35-8.1", "pc-q35-9.0+pve1", "pc", "pc-i440fx-8.1"]
BOARDS = ["0000:c1:00.0", "0000:e1:00.0"]


def _facts(machine: str | None) -> object:
    conf = f"name: vm129\n{f'machine: {machine}' if machine else ''}\n"
    return kpro6(PveGuestConfigs=configs(("/etc/pve/qemu-server/129.conf", conf)))


@pytest.mark.parametrize("machine", MACHINES)
def test_spec_plan_and_audit_agree_on_q35(machine: str) -> None:
    q35 = machine_is_q35(machine)
    try:
        host(KPRO6, vm(129, BOARDS, machine=machine), lxc(200, "rest"))
        spec_accepts = True
    except ValidationError:
        spec_accepts = False
    assert spec_accepts == q35

    left_to_config = host(KPRO6, vm(129, BOARDS, machine=None), lxc(200, "rest"))
    try:
        make_plan("kpro6", left_to_config, _facts(machine))
        plan_accepts = True
    except PlanError:
        plan_accepts = False
    assert plan_accepts == q35

    spec = host(KPRO6, vm(129, BOARDS, machine="q35"), lxc(200, "rest"))
    plan = make_plan("kpro6", spec, _facts("q35"))
    ctx = SimpleNamespace(plan=plan, host=SimpleNamespace(facts=_facts(machine)))
    guest = next(g for g in spec.vm_guests if g.vmid == 129)
    assert (vm_machine(ctx, guest) == []) == q35


def test_no_machine_is_not_q35() -> None:
    assert not machine_is_q35(None) and not machine_is_q35("")
