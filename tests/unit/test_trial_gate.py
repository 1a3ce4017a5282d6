"""The trial boot's gate on real captured output (the 1x H200 audit run, replayed): the true
inventory passes it, and a host that came up with the wrong driver or parameters does not."""

from __future__ import annotations

from gpuhost.audit.gate import GATE, run_gate
from gpuhost.observe.cuda import DEFAULT_SIZES
from gpuhost.spec.inventory import load_inventory
from tests.unit.test_audit_replay import WRONG, replay


def gate(inventory: str, name: str):
    spec = load_inventory(inventory)[name][0]
    return run_gate(name, spec, replay, sizes=DEFAULT_SIZES)


def test_the_true_inventory_passes_the_gate_in_one_command():
    result = gate("inventory/h200.py", "h200")
    assert result.ok, result.failed
    assert result.commands == 1
    assert set(result.passed) | {s.split(":")[0] for s in result.not_applicable} == set(GATE)
    assert "driver.compiler" in result.passed and "driver.version" in result.passed


def test_a_wrong_driver_fails_the_gate_naming_the_check_and_what_was_found():
    result = gate(WRONG, "h200-driver")
    assert not result.ok
    assert [line.split(":")[0] for line in result.failed] == ["driver.version"]
    assert "580.159.04" in result.failed[0]


def test_uvm_parameters_are_part_of_the_gate():
    result = gate(WRONG, "h200-hmm")
    assert [line.split(":")[0] for line in result.failed] == ["modules.parameters"]
