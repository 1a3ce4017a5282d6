"""The vm tier's kernel recipes, checked without building: releases gpuhost accepts, and the
options the tier's boots depend on. The real builds and boots are the vm tier's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuhost.build.kernel import fragment_lines
from gpuhost.spec.grammar import KERNEL_RE
from tests.build import kernel_cache
from twin.vm import kernel

# What the vm tier's tests rely on, and how: built in ("y") where the boot needs it before any
# module can load (root disk, root filesystem, console, EFI variables), a module ("m") where the
# test is about loading or ordering the module itself.
REQUIRED = {
    "CONFIG_EFI_STUB": "y",
    "CONFIG_EFIVAR_FS": "y",
    "CONFIG_SERIAL_8250_CONSOLE": "y",
    "CONFIG_ACPI": "y",
    "CONFIG_PCIEPORTBUS": "y",
    "CONFIG_PCI_MSI": "y",
    "CONFIG_INTEL_IOMMU": "y",
    "CONFIG_AMD_IOMMU": "y",
    "CONFIG_IRQ_REMAP": "y",
    "CONFIG_VFIO": "m",
    "CONFIG_VFIO_PCI": "m",
    "CONFIG_USB_XHCI_PCI": "m",
    "CONFIG_WATCHDOG_CORE": "y",
    "CONFIG_I6300ESB_WDT": "m",
    "CONFIG_SOFT_WATCHDOG": "m",
    "CONFIG_SOFTLOCKUP_DETECTOR": "y",  # /proc/sys/kernel/softlockup_panic
    "CONFIG_HARDLOCKUP_DETECTOR": "y",  # /proc/sys/kernel/hardlockup_panic
    "CONFIG_DETECT_HUNG_TASK": "y",  # /proc/sys/kernel/hung_task_panic
    "CONFIG_PROC_SYSCTL": "y",  # /proc/sys at all
    "CONFIG_MAGIC_SYSRQ": "y",
    "CONFIG_KALLSYMS": "y",
    "CONFIG_MODULE_UNLOAD": "y",
    "CONFIG_VIRTIO_BLK": "y",
    "CONFIG_EXT4_FS": "y",
    "CONFIG_CRYPTO_CRC32C": "y",
    "CONFIG_VFAT_FS": "y",
    "CONFIG_NLS_CODEPAGE_437": "y",
    "CONFIG_NLS_ISO8859_1": "y",
    "CONFIG_EFI_PARTITION": "y",
    "CONFIG_BLK_DEV_DM": "y",
    "CONFIG_VIRTIO_NET": "y",
    "CONFIG_PACKET": "y",
    "CONFIG_RD_ZSTD": "y",
    "CONFIG_BINFMT_SCRIPT": "y",
    "CONFIG_CGROUPS": "y",
    "CONFIG_SECCOMP_FILTER": "y",
    "CONFIG_AUTOFS_FS": "y",
    "CONFIG_DEVTMPFS": "y",
    "CONFIG_UNIX98_PTYS": "y",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A stand-in tree: the recipes read only the Makefile's version."""
    (tmp_path / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 1\nSUBLEVEL = 158\n")
    return tmp_path


def test_both_releases_are_proxmox_like_distinct_and_not_the_build_tiers(tree: Path):
    old = kernel.recipe(tree, kernel.OLD_LOCALVERSION)
    new = kernel.recipe(tree, kernel.NEW_LOCALVERSION)
    assert (old.release, new.release) == ("6.1.158-7-pve", "6.1.158-8-pve")
    for r in (old, new):
        assert KERNEL_RE.fullmatch(r.release), r.release
        assert r.release == "6.1.158" + r.localversion  # what make kernelrelease must print
    assert kernel_cache.LOCALVERSION not in (old.localversion, new.localversion)


def test_the_two_recipes_differ_only_in_the_release(tree: Path):
    """So the second build reuses the first's compiled objects where ccache is installed."""
    old = kernel.recipe(tree, kernel.OLD_LOCALVERSION)
    new = kernel.recipe(tree, kernel.NEW_LOCALVERSION)
    assert (old.base_config, old.cc, old.fragment) == ("tinyconfig", "gcc-12", kernel.FRAGMENT)
    assert (new.base_config, new.cc, new.fragment) == (old.base_config, old.cc, old.fragment)


def test_the_fragment_has_what_the_tier_depends_on():
    wrong = {k: kernel.FRAGMENT.get(k) for k, v in REQUIRED.items() if kernel.FRAGMENT.get(k) != v}
    assert not wrong, f"FRAGMENT lacks or changed: {wrong} (wanted {REQUIRED})"
    assert all(v in ("y", "m") for v in kernel.FRAGMENT.values())
    assert all(re.fullmatch(r"CONFIG_[A-Z0-9_]+", k) for k in kernel.FRAGMENT)
    assert len(fragment_lines(kernel.FRAGMENT)) == len(kernel.FRAGMENT)


def test_every_fragment_entry_says_why():
    source = Path(kernel.__file__).read_text()
    block = source[source.index("FRAGMENT = {") : source.index("\n}\n", source.index("FRAGMENT"))]
    entries = [line for line in block.splitlines() if line.strip().startswith('"CONFIG_')]
    assert len(entries) == len(kernel.FRAGMENT)
    silent = [line.strip() for line in entries if not re.search(r'",\s+# \S', line)]
    assert not silent, f"entries without a why-comment: {silent}"


def test_the_compiler_wrapper_runs_the_real_gcc_12():
    assert kernel.WRAPPER.startswith("#!/bin/sh\n")
    assert kernel.WRAPPER.rstrip().endswith('exec /usr/bin/gcc-12 "$@"')
