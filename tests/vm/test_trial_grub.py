"""A new kernel command line on a real GRUB EFI boot chain (a Proxmox ext4 UEFI install's: GRUB
2.06 from the ESP, /boot/grub on the root file system, Debian's update-grub, initramfs-tools,
systemd): the deploy boots it once through gpuhost's trial entry (next_entry in a real grubenv,
cleared by GRUB's own save_env), the gate passes, the commit makes it the default; afterwards
the live panic settings are the production ones, a plain reboot boots the new line, and a
second run changes nothing. With the IOMMU on after that, the GPU boards' real intel-iommu
groups (twin/vm/boards.py) are what gpuhost's plan reads and judges. The tests share one VM and
run in file order; each asks for the first deploy, so it also runs alone."""

from __future__ import annotations

import pytest

from tests.vm.conftest import (
    PRODUCTION,
    assert_groups_read_and_judged,
    deploy,
    plain_reboot,
    sysctls,
    vm_spec,
)
from twin.vm import boards
from twin.vm.qemu import Vm

PLANNED = ("intel_iommu=on", "iommu=pt", "pcie_aspm=off")  # an Intel CPU with its IOMMU


@pytest.fixture(scope="module")
def vm(booted) -> Vm:
    return booted("grub", extra=boards.topology())  # the boards do not concern the deploy


@pytest.fixture(scope="module")
def first(vm: Vm, vm_kernels, tmp_path_factory) -> tuple[object, int]:
    start = vm.console_offset()
    done = deploy(vm, vm_spec(vm_kernels.old), tmp_path_factory.mktemp("deploy"))
    return done, start


def test_the_trial_boots_once_passes_its_gate_and_is_committed(vm: Vm, first) -> None:
    done, start = first
    assert done.rc == 0, done.output[-3000:]
    assert "passed its trial boot" in done.output
    # GRUB itself booted gpuhost's trial entry, whose initramfs armed the backstop
    vm.wait_console(r"Loading Linux \S+ \(gpuhost trial\)", 10, since=start)
    line = vm.wait_console(r"Command line: (.*gpuhost\.trial=1.*)", 10).group(1).split()
    assert all(p in line for p in PLANNED) and "panic=10" in line
    vm.wait_console(r"gpuhost: trial boot: backstop reboot in \d+s", 10)


def test_after_the_commit_the_host_runs_with_production_panic_settings(vm: Vm, first) -> None:
    cmdline = vm.ssh("cat /proc/cmdline").stdout.split()
    assert "gpuhost.trial=1" in cmdline  # still the trial boot: the commit does not reboot
    assert sysctls(vm) == PRODUCTION
    # the one-shot was spent by GRUB, the trial entry and its backstop are gone, disarmed
    assert "next_entry=" not in vm.ssh("grub-editenv /boot/grub/grubenv list").stdout
    leftovers = "/etc/grub.d/45_gpuhost-trial /boot/gpuhost-trial /run/gpuhost-trial-backstop.pid"
    assert vm.ssh(f"ls -d {leftovers} 2>/dev/null", check=False).stdout == ""
    assert "gpuhost-trial" not in vm.ssh("cat /boot/grub/grub.cfg").stdout
    assert vm.ssh("pgrep -f 'sleep [0-9]'", check=False).returncode == 1  # no backstop waits


def test_a_second_run_changes_nothing(vm: Vm, first, vm_kernels, tmp_path_factory) -> None:
    again = deploy(vm, vm_spec(vm_kernels.old), tmp_path_factory.mktemp("again"))
    assert again.rc == 0 and not again.changed, again.output[-3000:]


def test_a_plain_reboot_boots_the_new_line_as_the_default(vm: Vm, first) -> None:
    cmdline = plain_reboot(vm, PLANNED)
    assert not any(p.startswith(("panic=", "oops=")) for p in cmdline)
    # iommu=pt: the host's devices get identity domains, in real IOMMU groups
    types = vm.ssh("cat /sys/kernel/iommu_groups/*/type").stdout.split()
    assert types and set(types) == {"identity"}
    assert vm.ssh("ls /sys/class/iommu").stdout.split() == ["dmar0"]


def test_the_plan_reads_the_intel_iommus_groups(vm: Vm, first, vm_kernels, tmp_path) -> None:
    assert "intel_iommu=on" in vm.ssh("cat /proc/cmdline").stdout.split()  # the commit's
    assert_groups_read_and_judged(vm, vm_kernels.old, tmp_path)
