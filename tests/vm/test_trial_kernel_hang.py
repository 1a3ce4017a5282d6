"""A trial that hangs inside the kernel comes back through the detector gpuhost arms for it: on
the trial boot the root file system stops taking writes (frozen, as a storage path that stopped
answering), a writer waits in the kernel, sshd (ordered after it) never starts, and the kernel's
hung-task detector (its timeout set to 30 s by the fault: the host's own sysctl), which
``hung_task_panic=1`` on the trial entry alone turns into a panic, reboots it (panic=10) to
GRUB's default entry, long before the trial's deadline. The fault is a
unit of this test, conditioned on a parameter that only the trial's command line carries.

A watchdog device (QEMU's i6300esb, standing for a server's BMC watchdog) sits in the VM, bound
to its driver and set to power the VM off if it ever fires: gpuhost arms nothing on it
(Proxmox's watchdog-mux owns /dev/watchdog), and the trial comes back by the kernel's own
detector. A hang that no kernel detector sees comes back only through the
trial's deadline timer and backstop while userspace runs (tests/vm/test_trial_hang.py), else
through a watchdog the operator's BMC or watchdog-mux arms."""

from __future__ import annotations

from tests.vm.conftest import PRODUCTION, failed_trial, sysctls, vm_spec
from twin.vm.qemu import Vm

FAULT = "vmtier.fault=storage-hang"
# The host's own detector timeout (sysctl; the kernel's default is 120 s, and a blocked task is
# reported one to two timeouts after it blocked): shorter, so the test waits less.
HUNG_TASK_TIMEOUT = 30
FAULT_UNIT = f"""[Unit]
Description=vm tier fault: the root file system stops taking writes and a writer hangs
DefaultDependencies=no
ConditionKernelCommandLine={FAULT}
After=local-fs.target
Before=ssh.service

[Service]
Type=oneshot
TimeoutStartSec=infinity
ExecStart=/sbin/sysctl -q kernel.hung_task_timeout_secs={HUNG_TASK_TIMEOUT}
ExecStart=/sbin/fsfreeze --freeze /
ExecStart=/bin/touch /vmtier-hung-writer

[Install]
WantedBy=multi-user.target
"""


def watchdog_holders(vm: Vm) -> str:
    """The watchdog's driver (its device is there), then every process holding it open."""
    return vm.ssh(
        "test -c /dev/watchdog0 && grep -o '^i6300esb ' /proc/modules; "
        "find /proc/[0-9]*/fd -lname '/dev/watchdog*' 2>/dev/null; true"
    ).stdout.strip()


def test_a_trial_hung_in_the_kernel_comes_back_by_hung_task_panic(
    booted, vm_kernels, tmp_path
) -> None:
    # A watchdog that fired would power the VM off (QEMU's -action), ending it: every wait
    # below would fail, so the come-back shows that none fired.
    vm: Vm = booted("grub", extra=["-device", "i6300esb", "-action", "watchdog=poweroff"])
    assert watchdog_holders(vm) == "i6300esb"  # udev loaded it; nothing holds it
    vm.ssh("cat > /etc/systemd/system/vmtier-fault.service", input=FAULT_UNIT)
    vm.ssh("systemctl enable -q vmtier-fault.service")
    spec = vm_spec(vm_kernels.old, extra=[FAULT])  # deadline: the default 20 minutes
    line = failed_trial(
        vm,
        spec,
        tmp_path,
        r"INFO: task \S+ blocked for more than \d+ seconds",  # the time it has been blocked
        r"Kernel panic - not syncing: hung_task: blocked tasks",
        r"Rebooting in 10 seconds",
    )
    assert FAULT not in line
    assert sysctls(vm) == PRODUCTION
    assert vm.restarts >= 1 and vm.ended is None  # the panic's reset, not a power-off
    assert watchdog_holders(vm) == "i6300esb"  # gpuhost armed no watchdog
