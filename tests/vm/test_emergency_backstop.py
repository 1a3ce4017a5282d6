"""Trials that stop where no timer of the running system fires. One whose systemd stops in emergency mode, where no timer of the running system fires
(gpuhost-trial-deadline.timer needs timers.target) and no sshd answers: gpuhost's backstop in
the trial's initramfs (files/gpuhost-trial-backstop) reboots it by SysRq at its deadline after
boot, with no console input, and the real firmware and GRUB boot the old entry. The deploy waits
for the host, finds it back on its old command line and reports the failed trial. One that
stops in the initramfs's shell (root not found, or `break=`) comes back by the trial's own
`panic=` parameter, which initramfs-tools' panic() turns into a reboot instead of the shell
(scripts/functions, panic(): "Rebooting automatically due to panic= boot argument")."""

from __future__ import annotations

import pytest

from gpuhost.plan.trial.state import RECORD
from tests.vm.conftest import PRODUCTION, failed_trial, sysctls, vm_spec
from twin.vm.qemu import Vm

DEADLINE_MINUTES = 2  # the least the spec allows; the backstop fires a minute after it


@pytest.fixture(scope="module")
def vm(booted) -> Vm:
    return booted("grub")


def test_a_trial_stopped_in_emergency_mode_comes_back_by_the_backstop(
    vm: Vm, vm_kernels, tmp_path
) -> None:
    spec = vm_spec(
        vm_kernels.old, extra=["systemd.unit=emergency.target"], deadline_minutes=DEADLINE_MINUTES
    )
    deadline = DEADLINE_MINUTES * 60 + 60
    line = failed_trial(
        vm,
        spec,
        tmp_path,
        r"gpuhost: trial boot: backstop reboot in \d+s",
        r"You are in emergency mode",
        rf"gpuhost: trial boot not confirmed within {deadline}s of its start",
        r"sysrq: Resetting",
    )
    assert not any("emergency" in p for p in line)
    assert "emergency" not in vm.ssh("cat /proc/cmdline").stdout
    assert sysctls(vm) == PRODUCTION
    # The trial boot's journal is lost: emergency mode stops before systemd-journal-flush moves
    # it to /var/log/journal, and SysRq's reboot ends it. The console (serial, IPMI SOL) is
    # where its end shows, as above.


def test_a_trial_stopped_in_the_initramfs_shell_comes_back_by_its_panic_parameter(
    vm: Vm, vm_kernels, tmp_path
) -> None:
    # After the trial above failed, a run reports that failure until the operator removes the
    # trial's record (plan/trial/state.py failed_message): the retry, as the operator makes it.
    vm.ssh(f"rm -f {RECORD}")
    spec = vm_spec(vm_kernels.old, extra=["break=premount"])
    line = failed_trial(
        vm,
        spec,
        tmp_path,
        r"gpuhost: trial boot: backstop reboot in \d+s",  # armed first, at init-top
        r"Spawning shell within the initramfs",
        r"Rebooting automatically due to panic= boot argument",
    )
    assert (
        "break=premount" not in line and "break=premount" not in vm.ssh("cat /proc/cmdline").stdout
    )
    assert sysctls(vm) == PRODUCTION
