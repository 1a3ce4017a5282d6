"""Direct kernel boot (profile_boot.py, boot.loader none): no loader in the machine chooses.

The hypervisor or firmware starts the profile's ``boot.kernel`` with ``boot.kernel_cmdline`` at
every boot (Firecracker's boot-source kernel_image_path and boot_args, QEMU's -kernel/-append),
whatever /boot, /etc/default/grub, a kernel pin or a one-shot say. A kernel that panics is
started again by the next boot: with panic=N that is a reboot loop, without it a hang.
"""

from __future__ import annotations

from twin import hwsim
from twin.boot_stop import panic_log
from twin.kernel_choice import (
    MAX_BOOTS,
    START_KERNEL,
    BrickedError,
    _record,
    gsp_mismatch,
    panic_timeout,
)
from twin.profile import Profile


def choose(hw: hwsim.Hw, profile: Profile) -> tuple[str, str, list[dict]]:
    """(kernel, /proc/cmdline, boot attempts) as kernel_choice.choose_kernel returns them."""
    kernel, cmdline = profile.boot.kernel or "", profile.boot.kernel_cmdline or ""
    hw.p(START_KERNEL).unlink(missing_ok=True)  # no choice to make: the first boot is the same
    why = "profile" if kernel in profile.failing_kernels else ""
    if not why and "oops=panic" in cmdline.split():  # else the oops kills modules-load only
        why = gsp_mismatch(hw, kernel)
    if not why:
        return kernel, cmdline, [{"kernel": kernel, "result": "booted"}]
    hw.state["panic_log"] = panic_log(kernel, cmdline, why)
    timeout = panic_timeout(cmdline)
    if timeout <= 0:
        _record(hw, [{"kernel": kernel, "result": "panicked; hung (no panic=N)"}])
        raise BrickedError(f"kernel {kernel} panics and hangs without panic=N: host bricked")
    _record(hw, [{"kernel": kernel, "result": f"panicked; rebooted (panic={timeout})"}] * MAX_BOOTS)
    raise BrickedError(
        f"reboot loop: the hypervisor keeps booting {kernel}, which panics: host bricked"
    )
