"""How a boot ends before anything can confirm it (stdlib plus twin): a panic's log, and where
a booted kernel stops: initramfs-tools' shell (BREAK_POINTS), a passphrase prompt in the
initramfs (CRYPTTAB), or systemd's emergency or rescue mode.

systemd boots rescue.target or emergency.target instead of the default when the command line
says so (systemd's man/kernel-command-line.xml: `emergency`, `-b` and `rescue`, `single`, `s`,
`S`, `1`, and `systemd.unit=`): no sshd, no timers.target, so neither gpuhost's gate nor its
deadline timer (gpuhost-trial-deadline.timer, WantedBy=timers.target) ever runs, and the host
waits for someone at the console. What brings such a trial back is gpuhost's backstop: an
initramfs-tools init-top script in /etc/initramfs-tools/scripts (files/gpuhost-trial-backstop),
armed by gpuhost.trial_deadline=<s> on the trial entry, which reboots by SysRq that many seconds
after boot (proven on real systemd in tests/vm). The twin's initramfs is a record of
/etc/initramfs-tools (twin.pve.initramfs), so the backstop is in a boot's initramfs when the
script was there when it was made. Only there: mkinitramfs orders each scripts/ directory of the
image from the scripts it finds under /etc/initramfs-tools/scripts and
/usr/share/initramfs-tools/scripts (initramfs-tools 0.142 hook-functions, get_source and
set_initlist), so a script that a hook copied into the image is never run.
"""

from __future__ import annotations

import re

BACKSTOP_SCRIPT = "/etc/initramfs-tools/scripts/init-top/gpuhost-trial-backstop"
# initramfs-tools 0.142 (Debian 12): init calls maybe_break at these points, in this order, and
# runs the init-top scripts (the backstop among them) between top and modules; maybe_break
# spawns the shell through panic() where `break=` (a comma list; bare `break` is premount)
# names the point (init L142-170, L216-295; scripts/functions maybe_break). A root device that
# never appears goes through the same panic().
BREAK_POINTS = ("top", "modules", "premount", "mount", "mountroot", "bottom", "init")
# cryptsetup-initramfs 2.6.1 (Debian 12): its hook copies into the image the crypttab entries
# of the root and resume devices and those with the `initramfs` option (hooks/cryptroot L159-194),
# and scripts/local-top/cryptroot asks each one's passphrase through askpass, which waits with no
# timeout (setup_mapping: the keyscript, then cryptsetup). local-top runs inside mountroot,
# after `maybe_break mountroot` (init L248-251): a break= up to mountroot stops first.
CRYPTTAB = "/etc/crypttab"
_BEFORE_LOCAL_TOP = BREAK_POINTS[: BREAK_POINTS.index("bottom")]
_RESCUE = {"rescue", "single", "s", "S", "1"}
_EMERGENCY = {"emergency", "-b"}


def userspace_stop(cmdline: str) -> str:
    """The target systemd stops in for this command line ('' when it boots normally); the
    last systemd.unit= wins, as systemd parses the line in order."""
    stop = ""
    for word in cmdline.split():
        if word in _EMERGENCY:
            stop = "emergency mode"
        elif word in _RESCUE:
            stop = "rescue mode"
        elif word.startswith("systemd.unit="):
            unit = word.removeprefix("systemd.unit=")
            stop = {"emergency.target": "emergency mode", "rescue.target": "rescue mode"}.get(
                unit, ""
            )
    return stop


def initramfs_stop(cmdline: str) -> str:
    """The first point where initramfs-tools' init stops in its shell ('' when it does not):
    the last break= wins, as init parses the line in order."""
    value = ""
    for word in cmdline.split():
        if word == "break":
            value = "premount"
        elif word.startswith("break="):
            value = word.removeprefix("break=")
    named = value.split(",")
    return next((p for p in BREAK_POINTS if p in named), "")


def initramfs_panic(cmdline: str) -> int | None:
    """What initramfs-tools' panic() does instead of its shell, from the last panic=: seconds
    before `reboot -f` (0 for a negative value: at once), -1 for `halt -f` (0 or not a number),
    None when no panic= is given (the shell waits). scripts/functions, panic()."""
    found = [w.removeprefix("panic=") for w in cmdline.split() if w.startswith("panic=")]
    if not found:
        return None
    value = found[-1]
    if re.fullmatch(r"-[0-9.]*", value):
        return 0
    if re.fullmatch(r"[0-9.]+", value) and value != "0":
        return int(float(value))
    return -1


def initramfs_prompt(initramfs: dict | None) -> str:
    """The crypttab target whose passphrase this initramfs asks for first ('' when none): the
    twin's hosts have no encrypted root, so only `initramfs`-option entries count."""
    text = ((initramfs or {}).get("files") or {}).get(CRYPTTAB, "")
    entries = [f.split() for f in text.splitlines() if not f.lstrip().startswith("#")]
    return next((f[0] for f in entries if len(f) >= 4 and "initramfs" in f[3].split(",")), "")


def stops(cmdline: str, initramfs: dict | None) -> bool:
    """Whether this boot stops before anything can confirm it (a shell, a prompt, a mode)."""
    return bool(initramfs_stop(cmdline) or initramfs_prompt(initramfs) or userspace_stop(cmdline))


def backstop_deadline(cmdline: str, initramfs: dict | None) -> int | None:
    """Seconds after boot at which gpuhost's backstop reboots this boot, or None: not armed
    (no gpuhost.trial_deadline=<digits> on the line, or an initramfs made without the script)."""
    found = re.findall(r"(?:^|\s)gpuhost\.trial_deadline=(\S*)", cmdline)
    value = found[-1] if found else ""
    files = (initramfs or {}).get("files") or {}
    if not value.isdigit() or BACKSTOP_SCRIPT not in files:
        return None
    return int(value)


def stop_log(kernel: str, cmdline: str, stop: str, deadline: int | None) -> list[str]:
    """The previous boot's log (`journalctl -b -1 -k`) of a boot that stopped in ``stop``."""
    lines = [f"Linux version {kernel}", f"Command line: {cmdline}"]
    if deadline is not None:
        lines.append(
            f"gpuhost: trial boot: backstop reboot in {deadline}s unless gpuhost confirms it"
        )
    lines.append(f"systemd[1]: Started {stop.capitalize().replace(' mode', ' Shell')}.")
    return lines + (_backstop_fired(deadline) if deadline is not None else [])


def _backstop_fired(deadline: int) -> list[str]:
    """The backstop's reason, then SysRq's sync, remount and reset (files/gpuhost-trial-backstop)."""
    return [
        f"gpuhost: trial boot not confirmed within {deadline}s of its start: rebooting to "
        "the default entry",
        "sysrq: Emergency Sync",
        "sysrq: Emergency Remount R/O",
        "sysrq: Resetting",
    ]


def _initramfs_stopped(
    kernel: str, cmdline: str, point: str, deadline: int | None
) -> tuple[list[str], str, str]:
    log = [f"Linux version {kernel}", f"Command line: {cmdline}"]
    if point != "top" and deadline is not None:  # init-top ran: the backstop is armed
        log.append(
            f"gpuhost: trial boot: backstop reboot in {deadline}s unless gpuhost confirms it"
        )
    else:
        deadline = None
    log.append("Spawning shell within the initramfs")
    where = f"the initramfs shell ({point})"
    delay = initramfs_panic(cmdline)
    panic = next((w for w in reversed(cmdline.split()) if w.startswith("panic=")), "")
    if delay is not None and delay >= 0:
        log.append("Rebooting automatically due to panic= boot argument")
        return log, f"stopped in {where}; rebooted by {panic}", ""
    if delay is not None:
        log.append("Halting automatically due to panic= boot argument")
        return log, f"halted in {where}", f"kernel {kernel} halts in the initramfs ({panic})"
    if deadline is None:
        why = f"kernel {kernel} stops in {where} and waits for someone at the console"
        return log, f"stopped in {where}; waits at the console", why
    log += [f"gpuhost: trial boot not confirmed within {deadline}s of its start: rebooting to "
            "the default entry", "sysrq: Resetting"]  # fmt: skip
    return log, f"stopped in {where}; rebooted by the backstop ({deadline} s)", ""


def _prompt_stopped(
    kernel: str, cmdline: str, target: str, deadline: int | None
) -> tuple[list[str], str, str]:
    """askpass waits at the console; panic= plays no part (no panic() is called). The prompt
    itself is console text, not the kernel's log."""
    log = [f"Linux version {kernel}", f"Command line: {cmdline}"]
    where = f"the initramfs' passphrase prompt for {target}"
    if deadline is None:
        why = f"kernel {kernel} stops at {where} and waits for someone at the console"
        return log, f"stopped at {where}; waits at the console", why
    log.append(f"gpuhost: trial boot: backstop reboot in {deadline}s unless gpuhost confirms it")
    log += _backstop_fired(deadline)
    return log, f"stopped at {where}; rebooted by the backstop ({deadline} s)", ""


def stopped(kernel: str, cmdline: str, initramfs: dict | None) -> tuple[list[str], str, str]:
    """(the boot's log, what happened, why the host is bricked or ''): gpuhost's backstop
    reboots it (into whatever the loader picks next, the one-shot consumed) where the trial
    armed it in this boot's initramfs; otherwise it waits for the console. A stop in the
    initramfs comes first, and there initramfs-tools' own panic= handling may reboot it."""
    deadline = backstop_deadline(cmdline, initramfs)
    point = initramfs_stop(cmdline)
    prompt = initramfs_prompt(initramfs)
    if point and (not prompt or point in _BEFORE_LOCAL_TOP):
        return _initramfs_stopped(kernel, cmdline, point, deadline)
    if prompt:
        return _prompt_stopped(kernel, cmdline, prompt, deadline)
    stop = userspace_stop(cmdline)
    log = stop_log(kernel, cmdline, stop, deadline)
    if deadline is None:
        why = f"kernel {kernel} stops in systemd's {stop} and waits for someone at the console"
        return log, f"stopped in {stop}; waits at the console", why
    return log, f"stopped in {stop}; rebooted by the backstop ({deadline} s)", ""


def panic_log(kernel: str, cmdline: str, why: str) -> list[str]:
    """The kernel log of a boot that panicked (what `journalctl -b -1 -k` shows afterwards)."""
    lines = [f"Linux version {kernel}", f"Command line: {cmdline}"]
    if why == "zfs":  # openzfs contrib/initramfs/scripts/zfs, then initramfs-tools' panic()
        return [*lines, "Failed to load ZFS modules.", "Manually load the modules and exit."]
    if why != "profile":
        lines += [
            f"NVRM: RmInitAdapter: GSP firmware mismatch ({why})",
            "NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x62:0x65:1800)",
            "BUG: kernel NULL pointer dereference, address: 0000000000000008",
            "Oops: 0000 [#1] PREEMPT SMP NOPTI",
        ]
    return [*lines, "Kernel panic - not syncing: Fatal exception"]
