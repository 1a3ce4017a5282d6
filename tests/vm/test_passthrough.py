"""Passthrough on real PCI, IOMMU and initramfs code, on an AMD host (amd-iommu, on by default):
the IOMMU groups of the boards' topology (twin/vm/boards.py), read by gpuhost's facts and judged
by its plan, and the early claim its Plan makes for a VM's board, carried out at boot by the real
initramfs-tools, kmod, udev and kernel.

Board A is a GPU with its USB-C controller (an xHCI that xhci_pci takes unless claimed); the
host's own xHCI sits on the root complex and must stay on xhci_hcd. The Plan's vfio files and
its initramfs step are applied here as the deploy applies them (the deploy's own writing of
files is the e2e tier's; a VM guest's hostpci needs Proxmox's qm, which this VM has not). The
same groups on intel-iommu: tests/vm/test_trial_grub.py. The tests share one VM and run in
file order; each asks for what it needs, so it also runs alone."""

from __future__ import annotations

import re

import pytest

from gpuhost.plan.make import Plan
from tests.vm.conftest import (
    assert_groups_read_and_judged,
    guests_spec,
    plan_of,
    stand_in_gpus,
    usb_c,
)
from twin.vm import boards
from twin.vm.qemu import BOOT_TIMEOUT, Vm


@pytest.fixture(scope="module")
def vm(booted) -> Vm:
    return booted("grub", iommu="amd", extra=boards.topology())


def test_the_plan_reads_the_amd_iommus_groups(vm: Vm, vm_kernels, tmp_path) -> None:
    assert vm.ssh("ls /sys/class/iommu").stdout.split() == ["ivhd0"]
    assert_groups_read_and_judged(vm, vm_kernels.old, tmp_path)


@pytest.fixture(scope="module")
def board_a(vm: Vm, vm_kernels, tmp_path_factory) -> tuple[str, Plan]:
    """Board A's GPU, and the Plan that gives it to VM 100."""
    gpu = stand_in_gpus(vm)["A"]
    return gpu, plan_of(vm, guests_spec(vm_kernels.old, {100: [gpu]}), tmp_path_factory.mktemp("p"))


def initrds(vm: Vm) -> dict[str, str]:
    out = vm.ssh("sha256sum /boot/initrd.img-*").stdout
    return {path: digest for digest, path in (line.split() for line in out.splitlines())}


@pytest.fixture(scope="module")
def claim_written(vm: Vm, board_a) -> dict[str, str]:
    """The Plan's vfio files written and its initramfs and systemd steps run, as the deploy
    does; returns the initrds' checksums from before."""
    _, plan = board_a
    files = [f for f in plan.files.values() if f.concern == "vfio" and f.present]
    assert {f.path for f in files} >= {"/etc/modprobe.d/gpuhost-vfio.conf"}, plan.files
    for f in files:
        parent = f.path.rsplit("/", 1)[0]
        if f.link is not None:
            vm.ssh(f"mkdir -p {parent} && ln -sfn {f.link} {f.path}")
        else:
            vm.ssh(
                f"mkdir -p {parent} && cat > {f.path} && chmod {f.mode} {f.path}", input=f.content
            )
    before = initrds(vm)
    steps = {s.name: s for s in plan.follow_ups}
    for name in ("initramfs", "systemd"):
        vm.ssh(steps[name].command, timeout=900)
    return before


def test_the_initramfs_of_the_kernel_that_boots_next_carries_the_claim(
    vm: Vm, claim_written, vm_kernels
) -> None:
    target = f"/boot/initrd.img-{vm_kernels.old}"
    assert initrds(vm)[target] != claim_written[target]
    listing = vm.ssh(f"lsinitramfs {target}").stdout.split()
    assert any(p.endswith("/vfio-pci.ko") for p in listing), listing
    assert "etc/modprobe.d/gpuhost-vfio.conf" in listing


def test_the_board_is_on_vfio_pci_from_the_initramfs_and_the_host_usb_on_xhci(
    vm: Vm, board_a, claim_written
) -> None:
    gpu, _ = board_a
    vm.reboot(BOOT_TIMEOUT)
    driver = vm.ssh(
        f"for f in {gpu} {usb_c(gpu)} {boards.HOST_XHCI}; do "
        'basename "$(readlink /sys/bus/pci/devices/$f/driver)"; done'
    ).stdout.split()
    assert driver == ["vfio-pci", "vfio-pci", "xhci_hcd"]
    kernel_log = vm.ssh("dmesg").stdout
    # xhci_hcd never had the board's USB-C function, not even for a moment, and had the host's
    assert f"xhci_hcd {boards.HOST_XHCI}: xHCI Host Controller" in kernel_log
    assert f"xhci_hcd {usb_c(gpu)}" not in kernel_log
    # vfio-pci came in the initramfs: VFIO's banner before the root file system's mount
    vfio = re.search(r"VFIO - User Level meta-driver", kernel_log)
    root = re.search(r"EXT4-fs \(vda\d\): mounted filesystem", kernel_log)
    assert vfio and root and vfio.start() < root.start(), kernel_log[-3000:]
    # and the boot unit, which moves what a driver took first, ran and found nothing to move
    unit = "gpuhost-vfio-claim.service"
    assert vm.ssh(f"systemctl show -P Result {unit}").stdout.strip() == "success"
    assert "-> vfio-pci" not in vm.ssh(f"journalctl -b -u {unit} -o cat --no-pager").stdout
