"""UEFI Secure Boot on the real chain: OVMF with Microsoft's keys enrolled boots Debian's signed
shim, signed GRUB and signed kernel (the grub-sb image, as a PVE 8.1+ Secure Boot install on
ext4). What gpuhost builds is unsigned, and the real firmware and kernel refuse it: the
locked-down kernel rejects an unsigned module, and shim rejects an unsigned kernel, whose trial
entry then reboots into the default by itself. gpuhost's plan foresees both and refuses before
its first change (gpuhost/plan/secure_boot.py). The tests share one VM, in file order."""

from __future__ import annotations

import re

import pytest

from gpuhost.plan.trial.entry import TRIAL_INITRD_DIR
from gpuhost.plan.trial.grub import (
    BACK_TO_DEFAULT,
    GRUB_TRIAL_ID,
    GRUB_TRIAL_SCRIPT,
    grub_trial_script,
)
from tests.vm.conftest import DRIVER, boot_files_digest, deploy
from tests.vm.test_kernel_trial import new_kernel_spec
from twin.vm.qemu import BOOT_TIMEOUT, Vm

# Drops a module's appended signature (kernel/module/signing.c: the marker string, then struct
# module_signature, whose last 4 bytes are the signature's length, big-endian, after it).
UNSIGN = r"""
import struct, sys
data = open(sys.argv[1], "rb").read()
marker = b"~Module signature appended~\n"
assert data.endswith(marker), "not a signed module"
(sig_len,) = struct.unpack(">I", data[-len(marker) - 4 : -len(marker)])
open(sys.argv[2], "wb").write(data[: -len(marker) - 12 - sig_len])
"""


@pytest.fixture(scope="module")
def vm(booted) -> Vm:
    return booted("grub-sb", secure_boot=True)


def signed_kernel(vm: Vm) -> str:
    (release,) = (k for k in vm.image.kernels if not k.endswith("-pve"))
    return release


def test_the_signed_chain_boots_with_secure_boot_in_force(vm: Vm) -> None:
    assert vm.ssh("mokutil --sb-state").stdout.strip() == "SecureBoot enabled"
    assert "[integrity]" in vm.ssh("cat /sys/kernel/security/lockdown").stdout
    assert vm.ssh("uname -r").stdout.strip() == signed_kernel(vm)
    vm.wait_console(r"secureboot: Secure boot enabled", 5, since=0)


def test_the_locked_down_kernel_rejects_an_unsigned_module(vm: Vm) -> None:
    vm.ssh("cat > /tmp/unsign.py", input=UNSIGN)
    vm.ssh("python3 /tmp/unsign.py $(modinfo -n dummy) /tmp/dummy-unsigned.ko")
    start = vm.console_offset()
    refused = vm.ssh("insmod /tmp/dummy-unsigned.ko", check=False)
    assert refused.returncode != 0 and "Key was rejected by service" in refused.stderr
    vm.wait_console(r"Loading of unsigned module is rejected", 10, since=start)
    vm.ssh("modprobe dummy && rmmod dummy")  # the same module, signed by Debian, loads


def test_the_plan_refuses_before_the_first_change(vm: Vm, vm_kernels, tmp_path) -> None:
    spec = new_kernel_spec(vm_kernels)  # the -pve kernel as gpuhost builds it, and its modules
    spec["driver"] = {"version": DRIVER, "source": {"tree": "/nowhere", "store": "/nowhere"}}
    before = boot_files_digest(vm)
    done = deploy(vm, spec, tmp_path)
    assert done.rc != 0, done.output[-3000:]
    refusals = re.findall(r"Secure Boot is on, [^\n]*", done.output)
    assert any("bad shim signature" in r for r in refusals), done.output[-3000:]
    assert any("loads no unsigned module" in r for r in refusals), done.output[-3000:]
    assert boot_files_digest(vm) == before


def test_shim_refuses_an_unsigned_trial_kernel_and_the_host_comes_back(vm: Vm) -> None:
    """gpuhost's own trial entry (as a plan that did not foresee Secure Boot would render it)
    for the unsigned -pve kernel: GRUB asks shim to verify it, shim refuses, and the entry
    reboots into the default (the signed kernel), with no console input."""
    (unsigned,) = (k for k in vm.image.kernels if k.endswith("-pve"))
    script = grub_trial_script(unsigned, f"root=UUID={vm.image.root_uuid} ro console=ttyS0,115200")
    vm.ssh(f"mkdir -p {TRIAL_INITRD_DIR} && cp /boot/initrd.img-{unsigned} {TRIAL_INITRD_DIR}/")
    vm.ssh(f"cat > {GRUB_TRIAL_SCRIPT} && chmod 755 {GRUB_TRIAL_SCRIPT}", input=script)
    vm.ssh(f"update-grub 2>&1 && grub-reboot {GRUB_TRIAL_ID}")
    start = vm.reboot(BOOT_TIMEOUT)
    vm.wait_console(rf"Loading Linux {re.escape(unsigned)} \(gpuhost trial\)", 10, since=start)
    vm.wait_console(r"error: bad shim signature", 10)  # GRUB's words for shim's refusal
    vm.wait_console(re.escape(BACK_TO_DEFAULT), 10)
    vm.wait_console(r"BdsDxe: starting", 10)  # the firmware again
    vm.wait_console(rf"Booting `Debian GNU/Linux, with Linux {signed_kernel(vm)}'", 10)
    assert vm.ssh("uname -r").stdout.strip() == signed_kernel(vm)
    env = vm.ssh("grub-editenv /boot/grub/grubenv list").stdout.splitlines()
    assert "next_entry=" in env and f"next_entry={GRUB_TRIAL_ID}" not in env
