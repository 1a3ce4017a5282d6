"""The trial boot's own kernel parameters and the live panic settings they leave: a trial
kernel that panics, oopses, locks up or hangs a task reboots by itself, and no host runs its
guests with those settings on (docs/reference/trial-boot.md §3; Documentation/admin-guide/sysctl/kernel.rst).
Pure."""

from __future__ import annotations

import re
import shlex

# On the trial boot's command line only, so a boot that came up through the trial entry can be
# told from the fallback even when both run the same kernel. The kernel ignores an unknown
# parameter with a dot in its name (init/main.c unknown_bootoption: "Unused module parameter"),
# so it reaches neither a module nor init.
TRIAL_MARK = "gpuhost.trial=1"
# The backstop deadline, seconds after boot (files/gpuhost-trial-backstop, an initramfs-tools
# init-top script): a trial that never reaches timers.target (a prompt in the initramfs,
# systemd's emergency or rescue mode) still reboots, with the kernel's SysRq. Later than the
# deadline timer's, which reboots cleanly where userspace got that far.
TRIAL_DEADLINE = "gpuhost.trial_deadline"
BACKSTOP_GRACE_S = 60
# The live sysctls the panic parameters set (Documentation/admin-guide/sysctl/kernel.rst:
# panic_on_oops, softlockup_panic, hardlockup_panic, hung_task_panic); the commit puts them back.
PANIC_SYSCTLS = {
    "oops": ("panic_on_oops", "panic"),
    "softlockup_panic": ("softlockup_panic", "1"),
    "nmi_watchdog": ("hardlockup_panic", "panic"),
    "hung_task_panic": ("hung_task_panic", "1"),
}


def trial_cmdline(panic_timeout: int, deadline_s: int) -> tuple[str, ...]:
    """A trial kernel that panics, oopses, locks up or hangs a task reboots by itself (§3),
    and a trial whose userspace stops anywhere before its gate reboots ``BACKSTOP_GRACE_S``
    after the deadline ``deadline_s`` at the latest. hung_task_panic is on the trial too: guests
    are stopped during it, so no storage load can hold a task in D state for long on a healthy
    kernel."""
    return (
        f"panic={panic_timeout}",
        "oops=panic",
        "softlockup_panic=1",
        "nmi_watchdog=panic",
        "hung_task_panic=1",
        TRIAL_MARK,
        f"{TRIAL_DEADLINE}={deadline_s + BACKSTOP_GRACE_S}",
    )


def trial_cmdline_names() -> tuple[str, ...]:
    return tuple(p.split("=", 1)[0] for p in trial_cmdline(0, 0))


def panic_sysctls(cmdline: list[str]) -> dict[str, str]:
    """/proc/sys/kernel values a boot with ``cmdline`` runs with (0 unless a parameter sets it;
    the kernel's own default panic timeout, CONFIG_PANIC_TIMEOUT, is 0 in Debian's and
    Proxmox's kernels): what the Plan expects after a commit. ``panic`` too: the trial's panic=N
    is live on the trial boot the commit keeps running (seen on a real boot, tests/vm)."""
    values = {name: "0" for name, _ in PANIC_SYSCTLS.values()}
    values["panic"] = "0"
    for param in cmdline:
        key, _, value = param.partition("=")
        if key in PANIC_SYSCTLS:
            name, on = PANIC_SYSCTLS[key]
            values[name] = "1" if value == on else "0"
        elif key == "panic" and re.fullmatch(r"-?\d+", value):  # kernel/panic.c core_param
            values["panic"] = str(int(value))
    return values


def without_trial_parameters(cmdline: list[str]) -> list[str]:
    """``cmdline`` less what the trial entry added: on a boot through it (its mark on the
    line), the last parameter of each trial name, since the entry appends them after the
    planned line (gpuhost/plan/trial/boot.py); any other boot's line as it is, so a panic=N of
    the host's own stays."""
    if TRIAL_MARK not in cmdline:
        return list(cmdline)
    names = set(trial_cmdline_names())
    kept: list[str] = []
    for param in reversed(cmdline):
        name = param.split("=", 1)[0]
        if name in names:
            names.discard(name)
            continue
        kept.append(param)
    return kept[::-1]


# Where they go: the trial boots a trial-only entry (systemd-boot's gpuhost-trial.conf, GRUB's
# gpuhost-trial menu entry) that carries the new command line plus these parameters; no other
# entry ever has them. The commit sets the live sysctls back to what the spec's own parameters
# ask (panic_sysctls) before guests start.


def settle_commands(values: dict[str, str]) -> tuple[str, ...]:
    """Set the live panic sysctls to the Plan's values (a trial boot runs with them on)."""
    return tuple(f"echo {shlex.quote(v)} > /proc/sys/kernel/{k}" for k, v in sorted(values.items()))
