"""A new kernel command line on a real systemd-boot chain laid out as proxmox-boot-tool keeps it,
on Debian 13 as Proxmox VE 9 is (systemd-boot 257 from an unmounted ESP, loader entries and kernels copied there from
/etc/kernel/cmdline by gpuhost's stand-in of the tool): the deploy writes gpuhost's trial entry,
sets the one-shot with the real `bootctl set-oneshot` (LoaderEntryOneShot in OVMF's variable
store), the real boot manager consumes it and boots the entry once, the gate passes and the
commit makes the kernel's own entry carry the new line; afterwards the live panic settings are
the production ones, a plain reboot boots the new line as the default, and a second run changes
nothing. The tests share one VM and run in file order; each asks for the first deploy, so it
also runs alone."""

from __future__ import annotations

import pytest

from tests.vm.conftest import PRODUCTION, deploy, plain_reboot, sysctls, vm_spec
from twin.vm.qemu import Vm

PLANNED = ("intel_iommu=on", "iommu=pt", "pcie_aspm=off")
LOADER_GUID = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"  # systemd's boot loader interface


def efivar(vm: Vm, name: str) -> str | None:
    """A loader variable's text (UTF-16LE after 4 bytes of attributes), None when unset."""
    path = f"/sys/firmware/efi/efivars/{name}-{LOADER_GUID}"
    done = vm.ssh(f"test -e {path} && cat {path} | tail -c +5 | tr -d '\\000'", check=False)
    return done.stdout if done.returncode == 0 else None


@pytest.fixture(scope="module")
def vm(booted) -> Vm:
    return booted("systemd-boot", "trixie")


@pytest.fixture(scope="module")
def first(vm: Vm, vm_kernels, tmp_path_factory) -> tuple[object, int]:
    start = vm.console_offset()
    done = deploy(vm, vm_spec(vm_kernels.old), tmp_path_factory.mktemp("deploy"))
    return done, start


def test_the_one_shot_entry_boots_once_passes_its_gate_and_is_committed(
    vm: Vm, first, vm_kernels
) -> None:
    done, start = first
    assert done.rc == 0, done.output[-3000:]
    assert "passed its trial boot" in done.output
    line = vm.wait_console(r"Command line: (.*gpuhost\.trial=1.*)", 10, since=start).group(1)
    assert all(p in line.split() for p in PLANNED) and "panic=10" in line.split()
    vm.wait_console(r"gpuhost: trial boot: backstop reboot in \d+s", 10)
    # the real boot manager took the one-shot (and removed it) and says which entry it booted
    assert efivar(vm, "LoaderEntrySelected") == "gpuhost-trial.conf"
    assert efivar(vm, "LoaderEntryOneShot") is None
    assert efivar(vm, "LoaderInfo").startswith("systemd-boot 257")
    assert "VERSION_CODENAME=trixie" in vm.ssh("cat /etc/os-release").stdout


def test_after_the_commit_the_host_runs_with_production_panic_settings(
    vm: Vm, first, vm_kernels
) -> None:
    assert "gpuhost.trial=1" in vm.ssh("cat /proc/cmdline").stdout.split()  # no reboot
    assert sysctls(vm) == PRODUCTION
    assert all(p in vm.ssh("cat /etc/kernel/cmdline").stdout.split() for p in PLANNED)
    # the trial entry and its files are gone from the ESP; the kernel's own entry has the line
    esp = vm.ssh("cat /etc/kernel/proxmox-boot-uuids").stdout.split()[0]
    mount = f"mkdir -p /run/esp && mount /dev/disk/by-uuid/{esp} /run/esp"
    listing = vm.ssh(
        f"{mount} && ls -R /run/esp/loader /run/esp/EFI && "
        f"cat /run/esp/loader/entries/proxmox-{vm_kernels.old}.conf; umount /run/esp"
    ).stdout
    assert "gpuhost-trial" not in listing
    options = next(x for x in listing.splitlines() if x.startswith("options"))
    assert all(p in options.split() for p in PLANNED) and "gpuhost.trial=1" not in options
    assert vm.ssh("ls /run/gpuhost-trial-backstop.pid", check=False).returncode != 0


def test_a_second_run_changes_nothing(vm: Vm, first, vm_kernels, tmp_path_factory) -> None:
    again = deploy(vm, vm_spec(vm_kernels.old), tmp_path_factory.mktemp("again"))
    assert again.rc == 0 and not again.changed, again.output[-3000:]


def test_a_plain_reboot_boots_the_new_line_as_the_default(vm: Vm, first, vm_kernels) -> None:
    cmdline = plain_reboot(vm, PLANNED, loader=None)
    assert not any(p.startswith(("panic=", "oops=")) for p in cmdline)
    assert efivar(vm, "LoaderEntrySelected") == f"proxmox-{vm_kernels.old}.conf"
