"""A new kernel on a real GRUB EFI boot chain: the deploy takes 6.1.192-8-pve's packages from
the artifact store gpuhost's build filled (twin/vm/kernel.py), dpkg installs them in the VM (their
hooks make the initramfs and run update-grub), and the trial boots the new kernel once through
GRUB's one-shot while the running kernel stays pinned as the default; the gate passes and the
commit pins the new kernel. Afterwards a plain reboot boots it, the old kernel is still there
to fall back to, and a second run changes nothing. The tests share one VM and run in file
order; each asks for the first deploy, so it also runs alone."""

from __future__ import annotations

import pytest

from tests.build.kernel_cache import GCC
from tests.vm.conftest import PRODUCTION, deploy, sysctls, vm_spec
from twin.vm import kernel
from twin.vm.qemu import BOOT_TIMEOUT, Vm


@pytest.fixture(scope="module")
def vm(booted) -> Vm:
    return booted("grub")


def new_kernel_spec(vm_kernels: kernel.VmKernels) -> dict:
    """The spec that asks for the new kernel, built from source into the vm tier's store."""
    spec = vm_spec(vm_kernels.new)
    spec["kernel"] |= {
        "source": "build",
        "build": {
            "repo": str(kernel.source_tree()),
            "base_config": kernel.BASE_CONFIG,
            "localversion": kernel.NEW_LOCALVERSION,
            "config": dict(kernel.FRAGMENT),
        },
    }
    return spec | {"toolchain": {"gcc": GCC}, "artifacts": {"store": str(vm_kernels.store)}}


@pytest.fixture(scope="module")
def first(vm: Vm, vm_kernels, tmp_path_factory) -> tuple[object, int, str]:
    """The first deploy, where the console was before it, and the old initrd's checksum."""
    start = vm.console_offset()
    old_initrd = initrd_digest(vm, vm_kernels.old)
    done = deploy(vm, new_kernel_spec(vm_kernels), tmp_path_factory.mktemp("deploy"))
    return done, start, old_initrd


def initrd_digest(vm: Vm, release: str) -> str:
    return vm.ssh(f"sha256sum /boot/initrd.img-{release}").stdout.split()[0]


def test_the_new_kernel_boots_once_through_the_one_shot_and_is_committed(
    vm: Vm, first, vm_kernels
) -> None:
    done, start, old_initrd = first
    assert done.rc == 0, done.output[-3000:]
    assert "passed its trial boot" in done.output
    new = vm_kernels.new
    vm.wait_console(rf"Loading Linux {new} \(gpuhost trial\)", 10, since=start)
    vm.wait_console(rf"Linux version {new} ", 10)
    assert vm.ssh("uname -r").stdout.strip() == new
    assert sysctls(vm) == PRODUCTION
    pin = vm.ssh("cat /etc/default/grub.d/proxmox-kernel-pin.cfg").stdout
    assert f"gnulinux-{new}-advanced-" in pin
    # the old kernel stays installed, its initrd byte for byte (every initramfs step names
    # the kernel that boots next, never -k all): the way back if the new one ever fails
    assert vm.ssh(f"ls /boot/vmlinuz-{vm_kernels.old}").stdout
    assert initrd_digest(vm, vm_kernels.old) == old_initrd


def test_a_second_run_changes_nothing(vm: Vm, first, vm_kernels, tmp_path_factory) -> None:
    again = deploy(vm, new_kernel_spec(vm_kernels), tmp_path_factory.mktemp("again"))
    assert again.rc == 0 and not again.changed, again.output[-3000:]


def test_a_plain_reboot_boots_the_new_kernel(vm: Vm, first, vm_kernels) -> None:
    start = vm.reboot(BOOT_TIMEOUT)
    vm.wait_console(r"GNU GRUB", 10, since=start)
    assert vm.ssh("uname -r").stdout.strip() == vm_kernels.new
    assert "gpuhost.trial=1" not in vm.ssh("cat /proc/cmdline").stdout
    assert sysctls(vm) == PRODUCTION
