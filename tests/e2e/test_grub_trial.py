"""A new command line or initramfs on plain GRUB is a trial: booted once through gpuhost's own
menu entry (/etc/grub.d/45_gpuhost-trial, named by next_entry), gated, then committed; the
default entry, /etc/default/grub and the kernel's own initramfs stay as they were until then.

The twins are the lumped board (GRUB on legacy BIOS) with /boot on a plain disk, or with GRUB
on a proxmox-boot-tool ESP, where GRUB's save_env clears next_entry (a true one-shot); GRUB on
LVM is kernel trials' refusal/acceptance (tests/e2e/test_boot_slice.py's lumped case accepts
it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ROOT, deploy, inventory, with_driver
from tests.e2e.test_boot_slice import LUMPED
from twin.modbuild import GSP_FIRMWARE

KVER = "6.8.12-9-pve"
ESP = "9B1C-4F2A"
LAYOUTS = {
    "plain": {"boot_on_lvm": False},  # /boot on a plain disk: GRUB's save_env can write
    # proxmox-boot-tool init <ESP> grub (btrfs root: the twin's kernel has no zfs.ko)
    "esp": {"grub_on_esp": True, "esp_uuids": [ESP], "root_fs": "btrfs"},
}


def plain_disk_grub(fresh, modules, tmp: Path, layout: str = "plain"):
    data = yaml.safe_load((ROOT / "gpuhost-twin/twin/profiles/lumped.yaml").read_text())
    data["boot"].update(LAYOUTS[layout])
    path = tmp / "lumped-plain-boot.yaml"
    path.write_text(yaml.safe_dump(data))
    twin = fresh(str(path))
    with_driver(twin, modules, LUMPED["driver"]["version"])
    return twin, inventory(tmp / "inv.py", twin, LUMPED)


def kernel_entries(cfg: str) -> str:
    """grub.cfg's 10_linux part: the menu entries the fallback boots."""
    return cfg.split("### BEGIN /etc/grub.d/10_linux ###", 1)[1].split("### END", 1)[0]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_new_command_line_on_grub_is_tried_through_its_own_entry(
    fresh, modules, tmp_path, layout
):
    twin, inv = plain_disk_grub(fresh, modules, tmp_path, layout)
    boot = f"var/lib/gpuhost-twin/esp/{ESP}" if layout == "esp" else "boot"  # GRUB's /boot
    first = deploy(inv)
    assert first.rc == 0, first.output[-4000:]
    assert "passed its trial boot" in first.output and first.reboots == 1, first.output[-3000:]
    twin.reconnect()
    cmdline = (twin.root / "proc/cmdline").read_text().split()
    # booted through the trial entry: its mark and panic parameters, the trial's own initramfs
    assert "gpuhost.trial=1" in cmdline and "oops=panic" in cmdline, cmdline
    image = f"/vmlinuz-{KVER}" if layout == "esp" else f"/boot/vmlinuz-{KVER}"
    assert "intel_iommu=on" in cmdline and cmdline[0] == f"BOOT_IMAGE={image}"
    # committed: the drop-in has the new line without the trial's; the entry and its files gone
    dropin = (twin.root / "etc/default/grub.d/zz-gpuhost.cfg").read_text()
    assert "intel_iommu=on" in dropin and "oops=panic" not in dropin
    cfg = (twin.root / boot / "grub/grub.cfg").read_text()  # the grub.cfg that boots
    assert "gpuhost-trial" not in cfg and "intel_iommu=on" in kernel_entries(cfg)
    assert not (twin.root / "etc/grub.d/45_gpuhost-trial").exists()
    assert not (twin.root / "boot/gpuhost-trial").exists()
    assert not (twin.root / boot / "gpuhost-trial").exists()
    for name in ("panic_on_oops", "softlockup_panic", "hardlockup_panic", "hung_task_panic"):
        assert (twin.root / f"proc/sys/kernel/{name}").read_text().strip() == "0", name
    second = deploy(inv)
    assert second.rc == 0 and not second.changed and second.reboots == 0, second.output[-3000:]


def test_a_new_command_line_that_fails_its_grub_trial_leaves_the_fallback(fresh, modules, tmp_path):
    """The trial boot panics (its oops=panic meets an nvidia oops: GSP firmware of another
    release); GRUB already cleared next_entry, so the default entry boots the old configuration,
    byte for byte as it was, and the run says so."""
    twin, inv = plain_disk_grub(fresh, modules, tmp_path)
    fw = twin.root / f"lib/firmware/nvidia/{LUMPED['driver']['version']}"
    fw.mkdir(parents=True, exist_ok=True)
    for blob in GSP_FIRMWARE:
        (fw / blob).write_bytes(b"twin GSP firmware 570.133.20\n")
    kept = {
        f: (twin.root / f).read_bytes() for f in ("etc/default/grub", f"boot/initrd.img-{KVER}")
    }
    entries = kernel_entries((twin.root / "boot/grub/grub.cfg").read_text())
    run = deploy(inv)
    assert run.rc != 0 and "did not come up" in run.output, run.output[-4000:]
    attempts = (twin.root / "var/lib/gpuhost-twin/hw.json").read_text()
    assert re.search(r'"result": "panicked[^"]*".*"result": "booted"', attempts, re.S), attempts
    twin.reconnect()
    cmdline = (twin.root / "proc/cmdline").read_text().split()
    assert "gpuhost.trial=1" not in cmdline and "oops=panic" not in cmdline  # the default entry
    assert "intel_iommu=on" not in cmdline
    assert all((twin.root / f).read_bytes() == data for f, data in kept.items())
    assert not (twin.root / "etc/default/grub.d/zz-gpuhost.cfg").exists()
    cfg = (twin.root / "boot/grub/grub.cfg").read_text()
    assert kernel_entries(cfg) == entries and "gpuhost-trial" not in cfg  # abandoned
    assert not (twin.root / "etc/grub.d/45_gpuhost-trial").exists()
    assert (twin.root / "proc/sys/kernel/panic_on_oops").read_text().strip() == "0"
    again = deploy(inv)  # not retried in a loop: the record stops it before any change
    assert again.rc != 0 and "new command line or initramfs" in again.output
