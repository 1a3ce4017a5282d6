"""The vfio-pci claim at boot: planned from the Plan's VM functions, rendered, and run."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gpuhost.plan import make_plan
from gpuhost.spec import HostSpec
from gpuhost.vfioplan import (
    CLAIM_SCRIPT,
    INITRAMFS_HOOK,
    MODPROBE_CONF,
    VfioBinding,
    board_functions,
    claim_script,
    misbound,
    plan_vfio,
)
from tests.unit.hosts import kpro6

KPRO6 = {"kernel": {"version": "6.14.8-2-bpo12-pve"}, "driver": {"version": "595.71.05"}}
VM_GPUS = ["0000:c1:00.0", "0000:e1:00.0"]
FUNCTIONS = ("0000:c1:00.0", "0000:c1:00.1", "0000:e1:00.0", "0000:e1:00.1")


def spec(*guests: dict) -> HostSpec:
    return HostSpec.model_validate({**KPRO6, "guests": list(guests)})


def vm_spec() -> HostSpec:
    return spec(
        {"kind": "vm", "vmid": 129, "name": "vm129", "machine": "q35", "gpus": VM_GPUS},
        {"kind": "lxc", "ctid": 200, "name": "ct200", "gpus": "rest"},
    )


def test_the_vms_boards_and_their_audio_functions_are_claimed() -> None:
    plan = make_plan("kpro6", vm_spec(), kpro6())
    assert plan.vfio is not None
    assert plan.vfio.bdfs == FUNCTIONS
    assert plan.vfio.modules == ("nvidia", "nouveau", "nvidiafb", "snd_hda_intel")
    conf = plan.files[MODPROBE_CONF].content
    assert conf is not None
    installs = [line for line in conf.splitlines() if line.startswith("install ")]
    assert installs[0] == (
        f"install nvidia {CLAIM_SCRIPT} && /sbin/modprobe --ignore-install nvidia $CMDLINE_OPTS"
    )
    assert [line.split()[1] for line in installs] == list(plan.vfio.modules)
    script = plan.files[CLAIM_SCRIPT]
    assert script.mode == "755" and script.content is not None
    assert f'FUNCTIONS="{" ".join(FUNCTIONS)}"' in script.content
    assert "0000:41:00.0" not in script.content  # the container's GPUs stay with nvidia
    assert plan.files[INITRAMFS_HOOK].content is not None
    initramfs = next(f for f in plan.follow_ups if f.name == "initramfs")
    assert {CLAIM_SCRIPT, MODPROBE_CONF, INITRAMFS_HOOK} <= set(initramfs.triggers)


def test_without_vm_gpus_the_files_are_planned_absent() -> None:
    plan = make_plan(
        "kpro6", spec({"kind": "lxc", "ctid": 200, "name": "ct", "gpus": "rest"}), kpro6()
    )
    assert plan.vfio is None
    for path in (CLAIM_SCRIPT, MODPROBE_CONF, INITRAMFS_HOOK):
        assert plan.files[path].content is None and not plan.files[path].present


def test_the_vms_boards_on_nvidia_move_live_with_all_their_functions() -> None:
    facts = kpro6()
    plan = make_plan("kpro6", vm_spec(), facts)
    assert misbound(plan.gpus, facts) == [
        ("0000:c1:00.0", "vfio-pci"),
        ("0000:e1:00.0", "vfio-pci"),
    ]
    assert board_functions(plan.gpus, facts, "C1:00.0") == ("0000:c1:00.0", "0000:c1:00.1")
    with pytest.raises(ValueError, match="is not a GPU of this host"):
        board_functions(plan.gpus, facts, "0000:42:00.0")
    # a GPU planned back on the host but held by vfio-pci now moves back to nvidia
    back = make_plan(
        "kpro6", spec({"kind": "lxc", "ctid": 200, "name": "ct", "gpus": "rest"}), facts
    )
    vfio_now = replace(back.gpus[6], driver_now="vfio-pci")
    assert misbound([*back.gpus[:6], vfio_now, back.gpus[7]], facts) == [("0000:c1:00.0", "nvidia")]


def test_only_addresses_the_strict_grammar_accepts_reach_the_script() -> None:
    with pytest.raises(ValueError, match="is not a PCI address"):
        plan_vfio({129: ("0000:c1:00.0; reboot",)}, {})
    assert plan_vfio({}, {}) is None
    binding = plan_vfio({129: ("C1:00.0",)}, {"0000:c1:00.0": "030000"})
    assert binding == VfioBinding(("0000:c1:00.0",), ("nvidia", "nouveau", "nvidiafb"))


def test_the_script_claims_unbound_functions_and_probes_them(tmp_path: Path) -> None:
    """The rendered script, run by /bin/sh with /sys and /sbin/modprobe relocated into tmp_path."""
    binding = VfioBinding(("0000:c1:00.0", "0000:c1:00.1", "0000:e1:00.0"), ("nvidia",))
    sysfs = tmp_path / "sys/bus/pci"
    for bdf in ("0000:c1:00.0", "0000:c1:00.1"):
        (sysfs / "devices" / bdf).mkdir(parents=True)
        (sysfs / "devices" / bdf / "driver_override").write_text("(null)\n")
    (sysfs / "devices/0000:c1:00.1/driver").mkdir()  # bound already: not probed again
    (sysfs / "drivers_probe").write_text("")
    log = tmp_path / "modprobe.log"
    stub = tmp_path / "modprobe"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    stub.chmod(0o755)
    text = claim_script(binding).replace("/sys/", f"{tmp_path}/sys/")
    text = text.replace("/sbin/modprobe", str(stub))
    run = subprocess.run(["/bin/sh", "-c", text], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    for bdf in ("0000:c1:00.0", "0000:c1:00.1"):
        assert (sysfs / "devices" / bdf / "driver_override").read_text() == "vfio-pci\n"
    assert log.read_text() == "vfio-pci\n"
    assert (sysfs / "drivers_probe").read_text() == "0000:c1:00.0\n"  # e1:00.0 is not on the bus
    stub.write_text("#!/bin/sh\nexit 1\n")  # vfio-pci cannot load: the insert must not go on
    run = subprocess.run(["/bin/sh", "-c", text], capture_output=True, text=True, check=False)
    assert run.returncode == 1


def test_a_move_killed_halfway_is_finished_by_the_next_run() -> None:
    facts = kpro6()
    for bdf in ("0000:c1:00.0", "0000:c1:00.1"):  # override written, unbound, never probed
        facts.pci[bdf] = replace(facts.pci[bdf], driver=None, driver_override="vfio-pci")
    plan = make_plan("kpro6", vm_spec(), facts)
    assert ("0000:c1:00.0", "vfio-pci") in misbound(plan.gpus, facts)
    for bdf in ("0000:c1:00.0", "0000:c1:00.1"):  # unbound without an override: the boot's
        facts.pci[bdf] = replace(facts.pci[bdf], driver_override=None)
    plan = make_plan("kpro6", vm_spec(), facts)
    assert ("0000:c1:00.0", "vfio-pci") not in misbound(plan.gpus, facts)
