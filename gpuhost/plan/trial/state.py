"""Where a trial boot stands, from what the host shows: its record, the running kernel, the boot id.

Before the reboot into a new kernel the deploy writes a record (/var/lib/gpuhost/trial): the
kernel on trial, the kernel it came from, the boot id before the reboot and the deadline. Each
run reads it back and decides the next step from it and from the running kernel alone, so a run
killed anywhere (before the reboot, during it, after it, between the gate and the pin) converges
on the next one, and a trial that failed is never retried in a loop:

    no record, target running, target pinned      -> converged, unless the host needs a boot
                                                     for its command line or modules: then a
                                                     trial of the new configuration (same kernel)
    no record, target running, not pinned         -> gate, then pin (booted by other means)
    no record, other kernel running               -> start a trial
    record, same boot as when it was written      -> the reboot did not happen: start it again
    record, new boot, the trial booted            -> gate, then commit (or go back)
    record, new boot, anything else               -> the trial failed and the host came back:
                                                     stop and say so (the user clears the record)

"The trial booted" is the trial kernel running, and, for a trial on the running kernel, the
trial entry's mark on /proc/cmdline (gpuhost.plan.trial.params.TRIAL_MARK): the fallback boots the
same kernel there.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gpuhost.paths import STATE_DIR

RECORD = f"{STATE_DIR}/trial"


class Step(enum.Enum):
    CONVERGED = "converged"
    START = "start the trial boot"
    GATE = "check the booted kernel, then pin it"
    FAILED = "the trial boot failed"


@dataclass(frozen=True)
class TrialRecord:
    kernel: str  # the kernel on trial
    previous: str  # the kernel the trial started from (the pinned fallback)
    boot_id: str  # /proc/sys/kernel/random/boot_id before the reboot
    deadline_s: int  # seconds after boot by which the trial must be confirmed
    method: str  # how the one-shot was set (systemd-boot, grub-esp, ...)

    def render(self) -> str:
        return "".join(f"{k}={v}\n" for k, v in self.__dict__.items())

    @classmethod
    def parse(cls, text: str | None) -> TrialRecord | None:
        """The record, or None when there is none; a damaged record reads as None only when it
        is empty (a half-written one names what is missing)."""
        if not text or not text.strip():
            return None
        values = dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)
        missing = [f for f in cls.__dataclass_fields__ if not values.get(f)]
        if missing:
            raise ValueError(f"{RECORD} lacks {', '.join(missing)}; remove it and run again")
        if not values["deadline_s"].isdigit():
            raise ValueError(f"{RECORD}: deadline_s={values['deadline_s']!r} is not a number")
        return cls(
            kernel=values["kernel"],
            previous=values["previous"],
            boot_id=values["boot_id"],
            deadline_s=int(values["deadline_s"]),
            method=values["method"],
        )


def next_step(
    record: TrialRecord | None,
    target: str,
    running: str,
    pinned: str | None,
    boot_id: str | None,
    trial_booted: bool = False,
    boot_due: bool = False,
) -> Step:
    """``trial_booted``: this boot came through the trial entry (its mark on /proc/cmdline);
    ``boot_due``: the running kernel needs a boot for its command line or modules, tried
    through a trial entry (only asked where the host has one)."""
    if record is None:
        if running != target:
            return Step.START
        if pinned not in (None, target):
            return Step.GATE
        return Step.START if boot_due else Step.CONVERGED
    if boot_id == record.boot_id:
        return Step.START
    if running == record.kernel and (record.kernel != record.previous or trial_booted):
        return Step.GATE
    return Step.FAILED


def _what(record: TrialRecord) -> str:
    if record.kernel == record.previous:
        return f"a new command line or initramfs on kernel {record.kernel}"
    return f"kernel {record.kernel}"


def failed_message(host: str, record: TrialRecord, running: str, journal: str | None) -> str:
    """What happened when a trial did not stick, with the trial boot's kernel log if kept."""
    text = (
        f"{host}: the trial boot of {_what(record)} ({record.method} one-shot) did not "
        f"come up, or was not confirmed within {record.deadline_s} s; the host is back on "
        f"{running}, which stays the default. Nothing was pinned. Find the cause in the trial "
        f"boot's log (`journalctl -b -1 -k` on the host), fix it, then remove {RECORD} and run "
        "the deploy again to retry."
    )
    if journal:
        text += f"\nThe previous boot's kernel log ends with:\n{journal}"
    else:
        text += "\nThe journal holds no previous boot (it is not kept across boots on this host)."
    return text
