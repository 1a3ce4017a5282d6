"""gpuhost's operations on fixtures, like pyinfra's own tests/operations: facts in, commands out.

Each case in tests/operations/<operation>/<case>.json gives the files the host holds now (the
batched ConfigFiles fact, as path -> content or {"link": target}), the operation's arguments,
and either the commands it must yield (exactly) or the noop it must report.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyinfra.context import ctx_host, ctx_state

from deploys import context, guests, ops, reboot
from gpuhost.plan.guests.power import Guest, GuestPower
from gpuhost.plan.make import Plan
from gpuhost.plan.model import HOST, FollowUp, ManagedFile, Reason

CASES = Path(__file__).parents[1] / "operations"
BOOT_ID = "11111111-2222-3333-4444-555555555555"


class FakeHost:
    """What the operations use of a pyinfra host: name, facts, noop/log."""

    def __init__(self, files: dict[str, Any]) -> None:
        self.name = "kpro6"
        self.print_prefix = "[kpro6] "
        self.state = SimpleNamespace(config=SimpleNamespace(DIFF=False))
        self.data: dict[str, Any] = {}
        self.noops: list[str] = []
        self.files = files

    def noop(self, description: str) -> None:
        self.noops.append(description)

    def log(self, message: str, log_func: Any = None) -> None:
        pass

    def get_fact(self, cls: Any, **kwargs: Any) -> dict[str, tuple[int, list[str]]]:
        """The Combined fact: the twin-free raw output of every fact the deploy reads."""
        from tests.unit.hosts import kpro6_raw

        raw = kpro6_raw()
        lines = []
        for path, value in self.files.items():
            if isinstance(value, dict):
                lines.append(f"L {path} {value['link']}")
            else:
                lines.append(f"F {path} {base64.b64encode(value.encode()).decode()}")
        raw["ConfigFiles"] = (0, lines)
        raw["BootId"] = (0, [BOOT_ID])
        raw["LoadedModules"] = (0, [])
        return raw


def _plan(case: dict[str, Any]) -> Plan:
    """A Plan holding just what the case's operation reads."""
    spec = case.get("plan", {})
    files = {
        path: ManagedFile(
            path,
            value if not isinstance(value, dict) else None,
            "modules",
            link=value["link"] if isinstance(value, dict) else None,
        )
        for path, value in spec.get("files", {}).items()
    }
    return Plan(
        host="kpro6",
        gpus=[],
        loader="systemd-boot",
        iommu_passthrough=False,
        cmdline_owned=[],
        cmdline_present=spec.get("cmdline_present", []),
        cmdline_absent=[],
        cmdline=[],
        running_cmdline=[],
        files=files,
        follow_ups=[],
        module_options={},
        blacklist=[],
        modules_load={},
        expected_parameters={},
        p2p={},
        guest_env={HOST: {}},
        running_kernel=spec.get("running_kernel", "6.8.12-9-pve"),
        next_boot_kernel=spec.get("next_boot_kernel"),
        pin_running_kernel=spec.get("pin_running_kernel", False),
        reboot_reasons=[Reason(c, t) for c, t in spec.get("reasons", [])],
    )


def _args(op: str, case: dict[str, Any]) -> dict[str, Any]:
    args = dict(case.get("args", {}))
    if "item" in args:
        item = args["item"]
        args["item"] = ManagedFile(
            item["path"],
            item.get("content"),
            "modules",
            mode=item.get("mode", "644"),
            link=item.get("link"),
        )
    if "follow_ups" in args:
        args["follow_ups"] = [FollowUp(**f) for f in args["follow_ups"]]
    if "step" in args:
        args["step"] = FollowUp(**args["step"])
        args["files"] = _plan(case).files
    if op.startswith("reboot."):
        args["plan"] = _plan(case)
    return args


OPERATIONS = {
    "ops.managed_file": ops.managed_file,
    "ops.files_as_planned": ops.files_as_planned,
    "ops.follow_up": ops.follow_up,
    "reboot.pin_kernel": reboot.pin_kernel,
    "reboot.reboot_and_confirm": reboot.reboot_and_confirm,
}
FILES = sorted(CASES.glob("*/*.json"))


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.stem}" for p in FILES])
def test_operation(path: Path) -> None:
    case = json.loads(path.read_text())
    op = path.parent.name
    fake = FakeHost(case.get("files", {}))
    context._observed.clear()
    with ctx_host.use(fake), ctx_state.use(fake.state):
        generator = OPERATIONS[op]._inner(**_args(op, case))
        if "exception" in case:
            with pytest.raises(Exception) as info:
                list(generator)
            assert type(info.value).__name__ == case["exception"]["name"]
            assert case["exception"]["message"] in str(info.value)
            return
        commands = [
            str(c) if isinstance(c, str) else c.get_raw_value()
            for c in generator
            if isinstance(c, str) or hasattr(c, "get_raw_value")
        ]
    assert commands == case.get("commands", []), commands
    if "noop_description" in case:
        assert fake.noops == [case["noop_description"]]
    else:
        assert fake.noops == []


REPORT_ONLY = {"ops.files_as_planned"}  # reports files that need nothing; never changes any


def test_every_operation_has_noop_and_change_cases() -> None:
    for op in OPERATIONS:
        cases = [json.loads(p.read_text()) for p in CASES.glob(f"{op}/*.json")]
        assert any("noop_description" in c for c in cases), op
        assert any(c.get("commands") for c in cases) or op in REPORT_ONLY, op


MANAGED_FILE_CASES = sorted((CASES / "ops.managed_file").glob("*.json"))


@pytest.mark.parametrize("path", MANAGED_FILE_CASES, ids=[p.stem for p in MANAGED_FILE_CASES])
def test_as_planned_is_exactly_a_managed_file_noop(path: Path) -> None:
    """apply_files gives settled files one operation per concern (files_as_planned): a file it
    counts as planned must be one that managed_file would leave alone, and no other."""
    case = json.loads(path.read_text())
    if "exception" in case:
        pytest.skip("managed_file stops here; apply_files never gets so far")
    fake = FakeHost(case.get("files", {}))
    context._observed.clear()
    with ctx_host.use(fake), ctx_state.use(fake.state):
        args = _args("ops.managed_file", case)
        assert ops.as_planned(args["item"]) == (case["commands"] == [])


FOLLOW_UP_CASES = sorted((CASES / "ops.follow_up").glob("*.json"))


@pytest.mark.parametrize("path", FOLLOW_UP_CASES, ids=[p.stem for p in FOLLOW_UP_CASES])
def test_settled_with_is_exactly_files_and_step_that_change_nothing(path: Path) -> None:
    """apply_files makes the files and their follow-up one operation when settled_with holds: it
    must hold exactly when every file is as managed_file would leave it and follow_up would
    run nothing."""
    case = json.loads(path.read_text())
    if "exception" in case:
        pytest.skip("follow_up stops here")
    fake = FakeHost(case.get("files", {}))
    context._observed.clear()
    with ctx_host.use(fake), ctx_state.use(fake.state):
        args = _args("ops.follow_up", case)
        step, files = args["step"], args["files"]
        items = [files[p] for p in step.triggers if p in files]
        quiet = case.get("commands", []) == [] and all(ops.as_planned(i) for i in items)
        assert ops.settled_with(items, step, files) == quiet


def test_a_run_that_booted_lets_pve_guests_start_the_onboot_guests_first() -> None:
    """After a boot, Proxmox's pve-guests.service starts the onboot guests on its own; the run
    waits for that before its guest steps, or a container it stops next (to restart it with
    its device entries) can be started again behind its back."""
    fake = FakeHost({})
    ct = Guest("lxc", 200, onboot=True)
    context._observed.clear()
    with ctx_host.use(fake), ctx_state.use(fake.state):
        booted = list(guests.start_guests._inner(power=GuestPower([], [], ""), after_boot=True))
        moved = list(guests.start_guests._inner(power=GuestPower([], [], "")))
        back = list(guests.start_guests._inner(power=GuestPower([ct], [ct], "x"), after_boot=True))
    settle = guests.pve_guests_settled(900)
    assert booted == [settle]
    assert "systemctl show -p ActiveState --value pve-guests.service" in settle
    assert "activating" in settle and "exit 1" in settle  # bounded, and says why it stopped
    assert moved == [] and fake.noops == ["no guest to bring back"]
    assert back[0] == settle and any("startall" in str(c) for c in back[1:])
