"""The trial boot's own parameters (gpuhost/plan/trial/params.py): what the committed boot keeps
running with, and the mark the deadline script looks for."""

from __future__ import annotations

from pathlib import Path

from gpuhost.plan.trial.params import (
    TRIAL_MARK,
    panic_sysctls,
    settle_commands,
    trial_cmdline,
    without_trial_parameters,
)


def test_the_trial_entry_parameters_are_not_the_production_values() -> None:
    """After a commit the host runs on the trial boot until its next reboot: the live values
    must become those of the committed line, the host's own panic=1 included (h200x1 has one)."""
    planned = ["root=UUID=x", "ro", "panic=1", "oops=panic", "iommu=pt"]  # boot.extra: oops
    trial_boot_line = planned + list(trial_cmdline(10, 1200))
    assert without_trial_parameters(trial_boot_line) == planned
    assert panic_sysctls(without_trial_parameters(trial_boot_line)) == {
        "panic": "1",
        "panic_on_oops": "1",
        "softlockup_panic": "0",
        "hardlockup_panic": "0",
        "hung_task_panic": "0",
    }
    assert without_trial_parameters(planned) == planned  # not a trial boot: nothing is the trial's
    assert settle_commands({"panic_on_oops": "0"}) == ("echo 0 > /proc/sys/kernel/panic_on_oops",)


def test_the_deadline_script_knows_the_trial_mark() -> None:
    script = (Path(__file__).parents[2] / "files/gpuhost-trial-deadline").read_text()
    assert f"grep -qw {TRIAL_MARK} /proc/cmdline" in script
