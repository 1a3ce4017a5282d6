"""A trial whose systemd stops in emergency mode, where no timer of the running system fires
(gpuhost-trial-deadline.timer needs timers.target) and no sshd answers: gpuhost's backstop in
the trial's initramfs (files/gpuhost-trial-backstop) reboots it by SysRq at its deadline after
boot, with no console input, and the real firmware and GRUB boot the old entry. The deploy waits
for the host, finds it back on its old command line and reports the failed trial."""

from __future__ import annotations

from tests.vm.conftest import PRODUCTION, deploy, sysctls, vm_spec
from twin.vm.qemu import Vm

DEADLINE_MINUTES = 2  # the least the spec allows; the backstop fires a minute after it


def test_a_trial_stopped_in_emergency_mode_comes_back_by_the_backstop(
    booted, vm_kernels, tmp_path
) -> None:
    vm: Vm = booted("grub")
    spec = vm_spec(
        vm_kernels.old, extra=["systemd.unit=emergency.target"], deadline_minutes=DEADLINE_MINUTES
    )
    start = vm.console_offset()
    done = deploy(vm, spec, tmp_path)
    assert done.rc != 0 and "the host is back on" in done.output, done.output[-3000:]
    vm.wait_console(r"Loading Linux \S+ \(gpuhost trial\)", 10, since=start)
    deadline = DEADLINE_MINUTES * 60 + 60
    vm.wait_console(r"gpuhost: trial boot: backstop reboot in \d+s", 10)
    vm.wait_console(r"You are in emergency mode", 10)
    vm.wait_console(rf"gpuhost: trial boot not confirmed within {deadline}s of its start", 10)
    vm.wait_console(r"sysrq: Resetting", 10)
    vm.wait_console(r"GNU GRUB", 10)
    line = vm.wait_console(r"Command line: (.*)", 10).group(1)
    assert "gpuhost.trial=1" not in line and "emergency" not in line
    assert "emergency" not in vm.ssh("cat /proc/cmdline").stdout
    assert sysctls(vm) == PRODUCTION
    # The trial boot's journal is lost: emergency mode stops before systemd-journal-flush moves
    # it to /var/log/journal, and SysRq's reboot ends it. The console (serial, IPMI SOL) is
    # where its end shows, as above.
