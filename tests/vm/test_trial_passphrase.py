"""A trial that stops at a passphrase prompt comes back by itself. The host has an encrypted
volume that its initramfs unlocks (crypttab's `initramfs` option, cryptsetup-initramfs 2.6.1,
Debian's own packages), added since its initramfs was last built, as an operator may: the
trial's initramfs, which gpuhost builds for the new configuration, is the first to carry it, and
its cryptroot script (local-top) asks "Please unlock disk NAME:" and waits for someone to type.
No timer of the running system fires there (systemd has not started); gpuhost's backstop, armed
by the trial's initramfs at init-top before cryptroot runs (files/gpuhost-trial-backstop),
reboots by SysRq at its deadline, and the real firmware and GRUB boot the old entry, whose
initramfs has no such prompt. No console input is given. While it asks, askpass has turned the
kernel's console messages off (klogctl(6)), so the backstop writes its reason to the console
itself: the console shows why the host rebooted.

The volume is a blank disk opened in plain mode: cryptroot prompts before it opens anything
(scripts/local-top/cryptroot, setup_mapping: the keyscript runs, then cryptsetup), and the VM
kernel has no dm-crypt, so nothing is ever opened."""

from __future__ import annotations

import subprocess

import pytest

from tests.vm.conftest import PRODUCTION, failed_trial, sysctls, vm_spec
from twin.vm import image
from twin.vm.qemu import Vm

DEADLINE_MINUTES = 2  # the least the spec allows; the backstop fires a minute after it
SERIAL = "vmtier-crypt"  # the blank disk's, so crypttab names it by id, not by probe order
CRYPTTAB = (
    f"vmtier_data /dev/disk/by-id/virtio-{SERIAL} none "
    # noauto: the old boot's systemd leaves it alone; the initramfs unlocks it all the same
    "plain,cipher=aes-xts-plain64,size=256,hash=sha256,initramfs,noauto\n"
)


@pytest.fixture(scope="module")
def vm(booted, tmp_path_factory) -> Vm:
    disk = tmp_path_factory.mktemp("crypt") / "data.raw"
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", disk, "16M"], check=True)
    drive = f"file={disk},if=none,id=data,format=raw"
    return booted(
        "grub", extra=["-drive", drive, "-device", f"virtio-blk-pci,drive=data,serial={SERIAL}"]
    )


def install(vm: Vm, debs: list) -> None:
    """dpkg -i of Debian's .debs copied in over SSH (the VM has no network)."""
    config = str(vm.workdir / "ssh_config")
    subprocess.run(["scp", "-q", "-F", config, *map(str, debs), "vm:/tmp/"], check=True)
    vm.ssh("dpkg -i /tmp/*.deb >/tmp/dpkg.log 2>&1 || { tail -20 /tmp/dpkg.log; false; }")


def test_a_trial_stopped_at_a_passphrase_prompt_comes_back_by_the_backstop(
    vm: Vm, vm_kernels, tmp_path
) -> None:
    install(vm, image.debian_debs(["cryptsetup-initramfs"]))  # its trigger rebuilds the old one
    vm.ssh("cat >> /etc/crypttab", input=CRYPTTAB)  # after that: only the trial's carries it
    spec = vm_spec(vm_kernels.old, deadline_minutes=DEADLINE_MINUTES)
    deadline = DEADLINE_MINUTES * 60 + 60
    start = vm.console_offset()
    failed_trial(
        vm,
        spec,
        tmp_path,
        r"gpuhost: trial boot: backstop reboot in \d+s",  # init-top, before cryptroot
        r"Please unlock disk vmtier_data",
        rf"gpuhost: trial boot not confirmed within {deadline}s of its start",
        r"sysrq: Resetting",
    )
    assert sysctls(vm) == PRODUCTION
    # the old entry's initramfs never asked: the host came back with no input
    assert vm.console_text()[start:].count("Please unlock disk") == 1
