"""A trial that hangs in userspace before its gate comes back by itself: the trial boot reaches
multi-user.target without sshd (masked on the trial entry's command line only), so gpuhost's gate
never starts; gpuhost-trial-deadline.timer, which runs on the trial boot, reboots it once the
deadline after boot has passed, and the real firmware and GRUB boot the default entry (the
one-shot was spent). The deploy waits for the host, finds it back on the old line and reports the
failed trial; the trial boot's own journal says why it rebooted."""

from __future__ import annotations

from tests.vm.conftest import PRODUCTION, failed_trial, sysctls, vm_spec
from twin.vm.qemu import Vm

DEADLINE_MINUTES = 2  # the least the spec allows


def test_a_trial_without_its_gate_is_rebooted_by_the_deadline_timer(
    booted, vm_kernels, tmp_path
) -> None:
    vm: Vm = booted("grub")
    spec = vm_spec(
        vm_kernels.old, extra=["systemd.mask=ssh.service"], deadline_minutes=DEADLINE_MINUTES
    )
    # then GRUB: the timer's reboot (before the backstop's minute)
    line = failed_trial(vm, spec, tmp_path, r"Reached target .*Multi-User System")
    assert not any(p.startswith("systemd.mask") for p in line)
    assert sysctls(vm) == PRODUCTION
    said = vm.ssh("journalctl -b -1 -o cat -u gpuhost-trial-deadline.service").stdout
    assert f"not confirmed within {DEADLINE_MINUTES * 60}s: rebooting to the default entry" in said
    kernel = vm.ssh("journalctl -b -1 -k -o cat").stdout
    assert "gpuhost.trial=1" in kernel and "systemd.mask=ssh.service" in kernel  # that boot
    assert "backstop reboot in" in kernel and "not confirmed within" not in kernel  # timer first
