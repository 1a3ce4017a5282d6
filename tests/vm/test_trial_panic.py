"""A trial that truly panics comes back by itself through the real firmware and GRUB: the trial
entry's kernel cannot mount its root (rdinit= names no program, so the kernel mounts root= itself,
and `root=UUID=` needs the initramfs), panics, panic=10 reboots it, GRUB boots the default entry
(next_entry was spent), and the deploy reports the failed trial. The old default is untouched, and
the next run reports the recorded cause instead of trying again."""

from __future__ import annotations

from tests.vm.conftest import PRODUCTION, deploy, failed_trial, sysctls, vm_spec
from twin.vm.qemu import Vm

# What the fallback boots: the kernel, its initramfs, the loader's command-line sources and the
# kernel entries GRUB renders from them (the run's pin of the running kernel, written before the
# trial and kept, makes the same entry the default by id instead of by position).
BOOT_FILES = "/etc/default/grub /boot/vmlinuz-* /boot/initrd.img-*"


def _fallback(vm: Vm) -> dict[str, str]:
    out = vm.ssh(f"sha256sum {BOOT_FILES}").stdout
    found = {path: digest for digest, path in (line.split() for line in out.splitlines())}
    entries = vm.ssh("grep -E '^\\s*(linux|initrd)\\s' /boot/grub/grub.cfg").stdout
    found["grub.cfg linux/initrd lines"] = entries
    found["gpuhost's command line"] = vm.ssh(
        "cat /etc/default/grub.d/zz-gpuhost.cfg 2>/dev/null", check=False
    ).stdout
    return found


def test_a_panicking_trial_comes_back_to_the_old_entry(booted, vm_kernels, tmp_path) -> None:
    vm = booted("grub")
    before = _fallback(vm)
    spec = vm_spec(vm_kernels.old, extra=["rdinit=/gpuhost-no-such-init"])
    # the console: the trial entry, the kernel's panic and its reboot, GRUB, the default entry
    line = failed_trial(
        vm,
        spec,
        tmp_path,
        r"Kernel panic - not syncing: VFS: Unable to mount root fs",
        r"Rebooting in 10 seconds",
    )
    assert not any(p.startswith("rdinit") for p in line)
    cmdline = vm.ssh("cat /proc/cmdline").stdout
    assert "rdinit" not in cmdline and "gpuhost.trial" not in cmdline
    assert sysctls(vm) == PRODUCTION
    assert _fallback(vm) == before  # byte for byte
    pin = vm.ssh("cat /etc/default/grub.d/proxmox-kernel-pin.cfg").stdout
    assert f"gnulinux-{vm_kernels.old}-advanced-" in pin  # the default: the kernel that ran
    assert "next_entry=" not in vm.ssh("grub-editenv /boot/grub/grubenv list").stdout
    # the next run names the recorded cause and changes nothing
    again = deploy(vm, spec, tmp_path / "again")
    assert again.rc != 0 and "/var/lib/gpuhost/trial" in again.output, again.output[-3000:]
    assert _fallback(vm) == before
