"""Legacy BIOS GRUB with /boot on LVM (the bios-lvm image: SeaBIOS, GRUB 2.06's i386-pc core,
/boot/grub on /dev/mapper/pve-root, as a Proxmox VE ext4 install on BIOS has it). GRUB reads
grubenv there but cannot write it, so next_entry is no one-shot: gpuhost's facts see that, and
the deploy refuses a trial, naming the ways out, before it changes anything. With
kernel.trial.without_oneshot: true the trial runs as far as it is honest: GRUB's own save_env
fails at boot ("diskfilter writes are not supported"), the trial entry boots, passes its gate,
and the commit clears next_entry from userspace; a plain reboot then boots the new line and a
second run changes nothing. The tests share one VM, in file order."""

from __future__ import annotations

import re

import pytest

from gpuhost.plan.trial.boot import WAYS_OUT
from tests.vm.conftest import PRODUCTION, boot_files_digest, deploy, plain_reboot, sysctls, vm_spec
from twin.vm.qemu import Vm

PLANNED = ("intel_iommu=on", "iommu=pt", "pcie_aspm=off")


@pytest.fixture(scope="module")
def vm(booted) -> Vm:
    return booted("bios-lvm")


def test_without_a_oneshot_the_trial_is_refused_before_any_change(
    vm: Vm, vm_kernels, tmp_path
) -> None:
    assert vm.ssh("test -d /sys/firmware/efi", check=False).returncode != 0  # SeaBIOS
    before = boot_files_digest(vm)
    done = deploy(vm, vm_spec(vm_kernels.old), tmp_path)
    assert done.rc != 0, done.output[-3000:]
    said = re.search(r"no true one-shot on this host: ([^\n]*)", done.output)
    assert said, done.output[-3000:]
    assert "/boot/grub is on /dev/mapper/pve-root (LVM or device-mapper)" in said[1]
    assert WAYS_OUT.split(" (")[0] in said[1] and "without_oneshot: true" in said[1]
    assert boot_files_digest(vm) == before


@pytest.fixture(scope="module")
def accepted(vm: Vm, vm_kernels, tmp_path_factory) -> tuple[object, int]:
    start = vm.console_offset()
    spec = vm_spec(vm_kernels.old, without_oneshot=True)
    return deploy(vm, spec, tmp_path_factory.mktemp("deploy")), start


def test_with_without_oneshot_the_trial_boots_passes_and_is_committed(vm: Vm, accepted) -> None:
    done, start = accepted
    assert done.rc == 0 and "passed its trial boot" in done.output, done.output[-3000:]
    vm.wait_console(r"error: diskfilter writes are not supported", 10, since=start)
    vm.wait_console(r"Loading Linux \S+ \(gpuhost trial\)", 10)
    line = vm.wait_console(r"Command line: (.*gpuhost\.trial=1.*)", 10).group(1).split()
    assert all(p in line for p in PLANNED)
    assert sysctls(vm) == PRODUCTION
    # GRUB could not clear it; the commit did
    assert "next_entry=gpuhost" not in vm.ssh("grub-editenv /boot/grub/grubenv list").stdout


def test_a_plain_reboot_boots_the_committed_line(vm: Vm, accepted) -> None:
    plain_reboot(vm, PLANNED)


def test_a_second_run_changes_nothing(vm: Vm, accepted, vm_kernels, tmp_path) -> None:
    spec = vm_spec(vm_kernels.old, without_oneshot=True)
    again = deploy(vm, spec, tmp_path)
    assert again.rc == 0 and not again.changed, again.output[-3000:]
