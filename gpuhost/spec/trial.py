"""The spec's trial boot settings (kernel.trial): how a new kernel is booted once before it
becomes the default. Kept apart from gpuhost/spec/host.py so each module stays small."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrialSpec(BaseModel):
    """How a new kernel is trial-booted: once, through the boot loader's one-shot."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    panic_timeout: int = Field(
        10,
        ge=1,
        le=300,
        description="panic=N: seconds before a panicked kernel reboots (into the pinned, "
        "known-good entry during a trial). It goes, with oops=panic, softlockup_panic=1, "
        "nmi_watchdog=panic and hung_task_panic=1, on the trial entry's command line only "
        "(systemd-boot's gpuhost-trial.conf, GRUB's gpuhost-trial menu entry). To keep panic=N "
        "for good, put it in boot.extra.",
    )
    deadline_minutes: int = Field(
        20,
        ge=2,
        le=240,
        description="Minutes after the trial kernel starts in which the trial boot must pass "
        "its post-boot checks, or it reboots itself back into the pinned kernel: "
        "gpuhost-trial-deadline.timer where userspace gets that far, and a minute later the "
        "backstop in the trial's initramfs (by SysRq) where it never reaches timers.target (a "
        "prompt in the initramfs, systemd's emergency or rescue mode). Count the whole boot "
        "up to SSH and gpuhost's reconnect.",
    )
    without_oneshot: bool = Field(
        False,
        description="Allow a trial on plain GRUB whose grubenv sits on LVM, RAID, ZFS or btrfs, "
        "where GRUB cannot clear next_entry (no true one-shot): a trial boot (a new kernel, "
        "command line or initramfs) that panics or hangs before userspace then keeps booting "
        "until someone at the console or IPMI picks the old entry. Without it such a trial is "
        "refused.",
    )
    parallel: bool = Field(
        False,
        description="Deploy this host (its trial reboot included) alongside the other "
        "parallel hosts of the run, in the first turn. By default the hosts of a run are "
        "deployed one at a time, in inventory order, each with its trial boot, gate and commit "
        "before the next host starts; once a host fails, the hosts after it change nothing.",
    )
