"""The vfio-pci claim at boot: planned from the Plan's VM functions, rendered, and run."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gpuhost.plan.guests.vfio import (
    CLAIM_SCRIPT,
    CLAIM_UNIT,
    CLAIM_WANTS,
    INITRAMFS_HOOK,
    MODPROBE_CONF,
    VfioBinding,
    board_functions,
    claim_command,
    insert_command,
    misbound,
    plan_vfio,
)
from gpuhost.plan.guests.vfio import modprobe_conf as modprobe_conf_text
from gpuhost.plan.make import make_plan
from gpuhost.spec.host import HostSpec
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
    claim = claim_command(plan.vfio)
    assert installs[0] == f"install nvidia {claim} && {insert_command('nvidia')}"
    assert [line.split()[1] for line in installs] == list(plan.vfio.modules)
    # each module's empty softdep, so kmod runs its install command (tests/twin/test_hw_kmod.py
    # puts that to real kmod)
    softdeps = [line for line in conf.splitlines() if line.startswith("softdep ")]
    assert softdeps == [f"softdep {m} pre:" for m in plan.vfio.modules]
    insert = insert_command("snd_hda_intel")
    assert "/sbin/modprobe --ignore-install snd_hda_intel && dep post:" in insert
    assert "s/^softdep snd_hda_intel //p" in insert and "#" not in insert
    assert f"for f in {' '.join(FUNCTIONS)}; do" in claim
    assert "0000:41:00.0" not in conf  # the container's GPUs stay with nvidia
    assert "#" not in claim  # modprobe.d would cut the line there
    initramfs = next(f for f in plan.follow_ups if f.name == "initramfs")
    assert MODPROBE_CONF in initramfs.triggers  # the initramfs carries modprobe.d
    # and vfio-pci, which MODULES=most does not copy, through gpuhost's hook
    hook = plan.files[INITRAMFS_HOOK]
    assert INITRAMFS_HOOK in initramfs.triggers and hook.mode == "755"
    assert hook.content is not None and "\nmanual_add_modules vfio_pci\n" in hook.content
    # the boot unit that moves what a built-in or early driver took, enabled, before guests
    unit, script = plan.files[CLAIM_UNIT].content, plan.files[CLAIM_SCRIPT].content
    assert unit is not None and "Before=pve-guests.service" in unit
    assert plan.files[CLAIM_WANTS].link == CLAIM_UNIT
    assert script is not None and f"for f in {' '.join(FUNCTIONS)}; do" in script
    systemd = next(f for f in plan.follow_ups if f.name == "systemd")
    assert CLAIM_UNIT in systemd.triggers


def test_without_vm_gpus_the_file_is_planned_absent() -> None:
    plan = make_plan(  # without VM 129's hand-made entries, which pass two of these GPUs
        "kpro6",
        spec({"kind": "lxc", "ctid": 200, "name": "ct", "gpus": "rest"}),
        kpro6(PveGuestConfigs=(0, [])),
    )
    assert plan.vfio is None
    for path in (MODPROBE_CONF, INITRAMFS_HOOK, CLAIM_SCRIPT, CLAIM_UNIT, CLAIM_WANTS):
        assert not plan.files[path].present, path


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
    facts = kpro6(PveGuestConfigs=(0, []))
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


def test_the_claim_binds_unbound_functions_and_probes_them(tmp_path: Path) -> None:
    """The rendered install command, run by /bin/sh as kmod's command_do would, with /sys and
    /sbin/modprobe relocated into tmp_path."""
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
    line = next(
        line for line in modprobe_conf_text(binding).splitlines() if line.startswith("install ")
    )
    # kmod puts the module's options where $CMDLINE_OPTS stood; the inner modprobe reads them
    # from modprobe.d itself, so the line must not carry them a second time
    assert "$CMDLINE_OPTS" not in line
    command = line.split(" ", 2)[2]
    command = command.replace("/sys/", f"{tmp_path}/sys/").replace("/sbin/modprobe", str(stub))
    run = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    for bdf in ("0000:c1:00.0", "0000:c1:00.1"):
        assert (sysfs / "devices" / bdf / "driver_override").read_text() == "vfio-pci\n"
    assert log.read_text() == "vfio-pci\n--ignore-install nvidia\n"
    assert (sysfs / "drivers_probe").read_text() == "0000:c1:00.0\n"  # e1:00.0 is not on the bus
    # vfio-pci cannot load (an initramfs without it): the overrides already keep host drivers
    # off the functions, so the module still loads for the host's own devices
    stub.write_text(f'#!/bin/sh\necho "$@" >> {log}; [ "$1" != vfio-pci ]\n')
    log.unlink()
    (sysfs / "drivers_probe").write_text("")
    run = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert log.read_text() == "vfio-pci\n--ignore-install nvidia\n"
    assert (sysfs / "drivers_probe").read_text() == ""  # nothing to probe without vfio-pci
    # an override that cannot be written fails closed: the module is not inserted
    (sysfs / "devices/0000:c1:00.0/driver_override").unlink()
    (sysfs / "devices/0000:c1:00.0/driver_override").mkdir()
    log.unlink()
    run = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=False)
    assert run.returncode == 1
    assert not log.exists()


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


def test_a_lumped_groups_other_devices_are_never_claimed() -> None:
    """While a planned ACS override is not active, the group read now may hold the host's NIC."""
    functions = {140: ("0000:19:00.0", "0000:1a:00.0")}  # GPU + NIC in one lumped group
    classes = {"0000:19:00.0": "030200", "0000:1a:00.0": "020000"}
    binding = plan_vfio(functions, classes)
    assert binding is not None and binding.bdfs == ("0000:19:00.0",)
