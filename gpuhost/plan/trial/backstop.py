"""The trial boot's backstop deadline in the trial's initramfs (files/gpuhost-trial-backstop):
a trial that never reaches timers.target, where gpuhost-trial-deadline.timer would reboot it
(a prompt in the initramfs, systemd's emergency or rescue mode), still reboots, by SysRq,
``gpuhost.trial_deadline`` seconds after boot. Pure: commands for the trial's steps.

Like GRUB's trial entry script, it exists for the trial only: written before the trial's
initramfs is made, removed with the trial entry (commit or abandon). It must be an init-top
script under /etc/initramfs-tools/scripts: mkinitramfs orders each scripts/ directory of the
image from the scripts it finds there and in /usr/share/initramfs-tools/scripts (initramfs-tools
0.142 hook-functions: get_source, set_initlist), so a script a hook copies into the image is
never run (seen on a real boot: tests/vm/test_trial_grub.py).
"""

from __future__ import annotations

from gpuhost.plan.driver.modconf import static_file
from gpuhost.plan.trial.esp import sh_quote

BACKSTOP_SCRIPT = "/etc/initramfs-tools/scripts/init-top/gpuhost-trial-backstop"
# Where the armed backstop leaves its pid: the initramfs' /run moves to the real root.
BACKSTOP_PID = "/run/gpuhost-trial-backstop.pid"


def write_backstop() -> str:
    """Put the script in place (atomically, executable: mkinitramfs skips others)."""
    path = sh_quote(BACKSTOP_SCRIPT)
    return (
        f"mkdir -p /etc/initramfs-tools/scripts/init-top && "
        f"printf %s {sh_quote(static_file('gpuhost-trial-backstop'))} > {path}.new && "
        f"chmod 755 {path}.new && mv -f {path}.new {path}"
    )


def drop_backstop() -> str:
    return f"rm -f {sh_quote(BACKSTOP_SCRIPT)} {sh_quote(BACKSTOP_SCRIPT + '.new')}"


def disarm() -> str:
    """Stop an armed backstop (its waiting process), on the trial boot once its gate starts."""
    # The waiting shell first: a sleep killed first would let it go on to the reboot. Its
    # sleep is found before (once the shell is gone, the sleep is nobody's child) and then
    # stopped too, so nothing of it is left running.
    return (
        f'if [ -s {BACKSTOP_PID} ]; then pid="$(cat {BACKSTOP_PID})"; '
        'kids="$(pgrep -P "$pid")"; kill "$pid" 2>/dev/null; '
        '[ -z "$kids" ] || kill $kids 2>/dev/null; '
        f"rm -f {BACKSTOP_PID}; fi"
    )
