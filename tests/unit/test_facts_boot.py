"""The BootPath fact: its parser on constructed outputs (formats of docs/reference/trial-boot.md) and its
command on this (non-Proxmox) machine."""

import subprocess
from pathlib import Path

import pytest

from gpuhost.observe.boot import BootPath, BootPathInfo, decode_efivar, parse_boot_path
from gpuhost.observe.hostfacts import ADDED_LATER, FACTS, parse_raw
from gpuhost.observe.parse import UnparsedOutput
from tests.unit.conftest import captured, proxmox, snapshot


def test_systemd_boot_host() -> None:
    path = parse_boot_path(proxmox("boot-path-systemd-boot.out"))
    assert path.known and path.uefi and path.systemd_boot_started
    assert path.efivars == {
        "LoaderInfo": "systemd-boot 252.39-1~deb12u2",
        "LoaderEntrySelected": "proxmox-6.8.12-9-pve.conf",
    }
    assert path.esp_uuids == ("4A1C-9E2B", "4A1D-03F7")
    assert (path.grub_source, path.grub_fstype) == ("rpool/ROOT/pve-1", "zfs")
    assert path.grubenv is None and path.pin is None
    assert (path.boot_free, path.boot_size) == (41875931136, 52613349376)


def test_grub_on_esp_host() -> None:
    path = parse_boot_path(proxmox("boot-path-grub-esp.out"))
    assert not path.uefi and not path.systemd_boot_started
    assert path.esp_uuids == ("8C2E-11D0",)
    assert path.grub_devid == "5f3a1c2e9b7d4e80"  # ZFS pool GUID in hex
    assert path.grubenv == {} and path.pin == "6.8.12-4-pve"


def test_lvm_root_has_no_grub_oneshot() -> None:
    path = parse_boot_path(proxmox("boot-path-grub-lvm.out"))
    assert path.esp_uuids is None  # not an ESP-managed host
    assert path.grub_source == "/dev/mapper/pve-root"
    assert "LVM" in (path.grubenv_unwritable_by_grub or "")
    assert path.next_boot_pin == "6.8.12-17-pve"
    assert path.grubenv is not None and path.grubenv["saved_entry"].startswith(
        "gnulinux-advanced-2b1f6a0c"
    )


def test_plain_partition_grub_can_write_its_env() -> None:
    path = parse_boot_path(proxmox("boot-path-grub-plain.out"))
    assert path.grubenv_unwritable_by_grub is None
    assert path.grubenv == {"next_entry": ""}  # what GRUB's save_env leaves after a one-shot


@pytest.mark.parametrize(
    ("source", "fstype", "why"),
    [
        ("/dev/md0", "ext4", "software RAID"),
        ("/dev/dm-0", "xfs", "device-mapper"),
        ("rpool/ROOT/pve-1", "zfs", "zfs"),
        ("/dev/sda3[/@rootfs]", "btrfs", "btrfs"),
    ],
)
def test_grubenv_places_grub_cannot_write(source: str, fstype: str, why: str) -> None:
    path = parse_boot_path([f"grubfs {source} {fstype}"])
    assert why in (path.grubenv_unwritable_by_grub or "")


def test_efivar_bytes_as_od_prints_them(tmp_path: Path) -> None:
    # the command's own pipeline on a file laid out like efivarfs: attributes, UTF-16LE, NUL
    var = tmp_path / "LoaderEntryOneShot"
    var.write_bytes(b"\x07\x00\x00\x00" + "proxmox-6.8.13-1-pve.conf\0".encode("utf-16-le"))
    hex_bytes = subprocess.run(
        ["sh", "-c", f"od -An -tx1 -v {var} | tr -d ' \\n'"], capture_output=True, text=True
    ).stdout
    assert decode_efivar(hex_bytes) == "proxmox-6.8.13-1-pve.conf"
    path = parse_boot_path([f"efivar LoaderEntryOneShot {hex_bytes}"])
    assert path.efivars == {"LoaderEntryOneShot": "proxmox-6.8.13-1-pve.conf"}


def test_unknown_lines_fail_loudly() -> None:
    with pytest.raises(UnparsedOutput, match="unexpected line"):
        parse_boot_path(["uefi maybe"])
    with pytest.raises(UnparsedOutput, match="unknown EFI variable"):
        parse_boot_path(["efivar BootOrder 0700000000000100"])
    with pytest.raises(UnparsedOutput, match="not hex"):
        parse_boot_path(["efivar LoaderInfo 07zz"])
    with pytest.raises(UnparsedOutput, match="AVAIL SIZE"):
        parse_boot_path(["boot-space 12 lots"])


def test_command_runs_cleanly_without_proxmox() -> None:
    # this machine has no proxmox-boot-tool, no ESP list and (likely) no EFI: rc 0, parseable
    run = subprocess.run(["sh", "-c", BootPath().command()], capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == ""
    path = BootPath().process(run.stdout.splitlines())
    assert path.known and path.boot_free is not None


def test_a_snapshot_without_it_loads_as_not_known() -> None:
    assert "BootPath" in FACTS and "BootPath" in ADDED_LATER
    facts = parse_raw(snapshot("h200x2"))
    assert facts.boot_path == BootPathInfo() and not facts.boot_path.known


def _sbvar(name: str, value: int) -> str:
    return f"sbvar {name} 06000000{value:02x}"  # boot-service + runtime access, then the byte


@pytest.mark.parametrize(
    ("lines", "on"),
    [
        (["uefi yes", _sbvar("SecureBoot", 1), _sbvar("SetupMode", 0)], True),
        (["uefi yes", _sbvar("SecureBoot", 0), _sbvar("SetupMode", 0)], False),
        # setup mode: no platform key, nothing is verified (shim.c secure_mode)
        (["uefi yes", _sbvar("SecureBoot", 1), _sbvar("SetupMode", 1)], False),
        # `mokutil --disable-validation`: shim verifies nothing, the kernel does not lock down
        (["uefi yes", _sbvar("SecureBoot", 1), _sbvar("MokSBStateRT", 1)], False),
        (["uefi yes"], False),  # firmware without the variable
        (["uefi no"], False),
    ],
)
def test_secure_boot_as_the_kernel_decides_it(lines: list[str], on: bool) -> None:
    assert parse_boot_path(lines).secure_boot is on


def test_secure_boot_variables_parse_strictly() -> None:
    with pytest.raises(UnparsedOutput, match="Secure Boot variable"):
        parse_boot_path(["sbvar PK 0600000001"])
    with pytest.raises(UnparsedOutput, match="Secure Boot variable"):
        parse_boot_path(["sbvar SecureBoot 06000000"])  # no data byte
    with pytest.raises(UnparsedOutput, match="Secure Boot variable"):
        parse_boot_path(["sbvar SecureBoot 0600000g01"])


def test_secure_boot_read_from_real_firmware() -> None:
    # OVMF with Microsoft's keys, booted through Debian's signed shim (captures/README.md)
    path = parse_boot_path(captured("vm-q35-secure-boot", "BootPath"))
    assert path.secure_boot_vars == {"SecureBoot": 1, "SetupMode": 0} and path.secure_boot
    assert path.grub_source == "/dev/vda2" and path.grubenv == {}
