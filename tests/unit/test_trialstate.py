"""Where a trial boot stands is decided from the host alone: its record, kernel and boot id."""

from __future__ import annotations

import pytest

from gpuhost.plan.trial.state import RECORD, Step, TrialRecord, failed_message, next_step

OLD, NEW = "6.8.12-9-pve", "6.14.8-2-bpo12-pve"
RECORDED = TrialRecord(kernel=NEW, previous=OLD, boot_id="b-1", deadline_s=1200, method="grub-esp")


def test_the_record_round_trips_and_a_damaged_one_names_what_is_missing():
    assert TrialRecord.parse(RECORDED.render()) == RECORDED
    assert TrialRecord.parse(None) is None and TrialRecord.parse("\n") is None
    with pytest.raises(ValueError, match="lacks boot_id, method"):
        TrialRecord.parse(f"kernel={NEW}\nprevious={OLD}\ndeadline_s=60\n")
    with pytest.raises(ValueError, match="not a number"):
        TrialRecord.parse(RECORDED.render().replace("1200", "20min"))


@pytest.mark.parametrize(
    ("record", "running", "pinned", "boot_id", "step"),
    [
        (None, NEW, NEW, "b-2", Step.CONVERGED),
        (None, NEW, None, "b-2", Step.CONVERGED),  # nothing else installed would boot instead
        (None, NEW, OLD, "b-2", Step.GATE),  # booted by other means: prove it, then pin it
        (None, OLD, OLD, "b-1", Step.START),
        (RECORDED, OLD, OLD, "b-1", Step.START),  # killed before the reboot happened
        (RECORDED, NEW, OLD, "b-2", Step.GATE),  # the trial kernel came up
        (RECORDED, OLD, OLD, "b-2", Step.FAILED),  # it panicked or missed the deadline
    ],
)
def test_next_step(record, running, pinned, boot_id, step):
    assert next_step(record, NEW, running, pinned, boot_id) is step


SAME = TrialRecord(kernel=NEW, previous=NEW, boot_id="b-1", deadline_s=1200, method="systemd-boot")


@pytest.mark.parametrize(
    ("record", "boot_id", "booted", "due", "step"),
    [
        (None, "b-1", False, True, Step.START),  # a new command line or module setting is due
        (None, "b-1", False, False, Step.CONVERGED),
        (SAME, "b-1", False, True, Step.START),  # killed before the reboot
        (SAME, "b-2", True, False, Step.GATE),  # the trial entry booted (its mark)
        # the same kernel, but through the fallback's own entry: the trial failed, and is
        # not retried in a loop even though the boot is still due
        (SAME, "b-2", False, True, Step.FAILED),
    ],
)
def test_a_trial_of_the_running_kernel_is_told_by_its_mark(record, boot_id, booted, due, step):
    assert next_step(record, NEW, NEW, NEW, boot_id, trial_booted=booted, boot_due=due) is step


def test_a_failed_trial_says_what_happened_and_how_to_retry():
    text = failed_message("kpro6", RECORDED, OLD, "[  3.1] Kernel panic - not syncing: VFS")
    assert f"trial boot of kernel {NEW}" in text and f"back on {OLD}" in text
    assert f"remove {RECORD}" in text and "Kernel panic" in text
    assert "not kept across boots" in failed_message("kpro6", RECORDED, OLD, None)
