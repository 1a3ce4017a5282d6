"""A new kernel command line on GRUB as proxmox-boot-tool lays it out on an ESP (its `grub` mode:
GRUB 2.06 with its grub.cfg and grubenv on the ESP, the kernels copied there, the ESP not
mounted; the copying by gpuhost's stand-in of the tool, GRUB, grubenv and the firmware real):
the trial entry boots once through next_entry in the ESP's grubenv (cleared by GRUB's own
save_env), the gate passes, the commit makes the new line the default; afterwards the live panic
settings are the production ones, a plain reboot boots the new line and a second run changes
nothing. The tests share one VM and run in file order; each asks for the first deploy, so it
also runs alone."""

from __future__ import annotations

import pytest

from tests.vm.conftest import PRODUCTION, deploy, plain_reboot, sysctls, vm_spec
from twin.vm.qemu import Vm

PLANNED = ("intel_iommu=on", "iommu=pt", "pcie_aspm=off")


@pytest.fixture(scope="module")
def vm(booted) -> Vm:
    return booted("grub-esp")


@pytest.fixture(scope="module")
def first(vm: Vm, vm_kernels, tmp_path_factory) -> tuple[object, int]:
    start = vm.console_offset()
    done = deploy(vm, vm_spec(vm_kernels.old), tmp_path_factory.mktemp("deploy"))
    return done, start


def on_esp(vm: Vm, command: str) -> str:
    """Run command with the (unmounted) ESP mounted at /run/esp."""
    esp = vm.ssh("cat /etc/kernel/proxmox-boot-uuids").stdout.split()[0]
    mount = f"mkdir -p /run/esp && mount /dev/disk/by-uuid/{esp} /run/esp"
    return vm.ssh(f"{mount} && {{ {command}; }}; umount /run/esp").stdout


def test_the_trial_boots_once_passes_its_gate_and_is_committed(vm: Vm, first) -> None:
    done, start = first
    assert done.rc == 0, done.output[-3000:]
    assert "passed its trial boot" in done.output
    vm.wait_console(r"Loading Linux \S+ \(gpuhost trial\)", 10, since=start)
    line = vm.wait_console(r"Command line: (.*gpuhost\.trial=1.*)", 10).group(1).split()
    assert all(p in line for p in PLANNED) and "panic=10" in line
    vm.wait_console(r"gpuhost: trial boot: backstop reboot in \d+s", 10)


def test_after_the_commit_the_esp_holds_the_new_default_and_no_trial(vm: Vm, first) -> None:
    assert "gpuhost.trial=1" in vm.ssh("cat /proc/cmdline").stdout.split()  # no reboot
    assert sysctls(vm) == PRODUCTION
    env = on_esp(vm, "grub-editenv /run/esp/grub/grubenv list")
    assert "next_entry=" not in env  # spent by GRUB at the trial's start
    cfg = on_esp(vm, "cat /run/esp/grub/grub.cfg")
    assert "gpuhost-trial" not in cfg and "gpuhost trial" not in cfg
    default = next(x for x in cfg.splitlines() if x.strip().startswith("linux"))
    assert all(p in default.split() for p in PLANNED), default


def test_a_second_run_changes_nothing(vm: Vm, first, vm_kernels, tmp_path_factory) -> None:
    again = deploy(vm, vm_spec(vm_kernels.old), tmp_path_factory.mktemp("again"))
    assert again.rc == 0 and not again.changed, again.output[-3000:]


def test_a_plain_reboot_boots_the_new_line_as_the_default(vm: Vm, first) -> None:
    plain_reboot(vm, PLANNED)
