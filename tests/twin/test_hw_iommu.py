"""Boot derivation of the IOMMU: options the kernel knows, groups and ACS, domain types, SEV-SNP."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from twin import boot, hwsim
from twin import hwtesting as ht
from twin.hwtesting import read, refresh, state
from twin.profile import load_profile

KVER = "6.8.12-9-pve"
SKIP = ht.missing_build_tools()
needs_build = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> ht.ModuleCache:
    return ht.ModuleCache()


def groups(root: Path) -> dict[int, list[str]]:
    base = root / "sys/kernel/iommu_groups"
    return {
        int(g.name): sorted(d.name for d in (g / "devices").iterdir())
        for g in (base.iterdir() if base.exists() else [])
    }


def test_intel_needs_intel_iommu_on_and_acs_override_splits(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "lumped")
    ht.boot_root(root, "lumped")
    assert groups(root) == {}
    assert not (root / "sys/bus/pci/devices/0000:19:00.0/iommu_group").exists()
    refresh(root, cmdline="root=/dev/mapper/pve-root ro quiet intel_iommu=on")
    ht.boot_root(root, "lumped")
    lumped = groups(root)[21]
    assert {"0000:19:00.0", "0000:1a:00.0", "0000:18:08.0"} <= set(lumped)
    link = os.readlink(root / "sys/bus/pci/devices/0000:19:00.0")
    assert link == "../../../devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:08.0/0000:19:00.0"
    refresh(
        root,
        cmdline="root=/dev/mapper/pve-root ro intel_iommu=on pcie_acs_override=downstream,multifunction",
    )
    ht.boot_root(root, "lumped")
    assert groups(root)[24] == ["0000:19:00.0"]
    assert "PCIe ACS overrides enabled" in read(root, hwsim.DMESG)


def test_amd_iommu_is_on_by_default_one_group_per_gpu(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    ht.boot_root(root, "kpro6")
    g = groups(root)
    assert g[12] == ["0000:01:00.0", "0000:01:00.1"]  # GPU with its audio function
    assert (
        os.readlink(root / "sys/bus/pci/devices/0000:01:00.0/iommu_group")
        == "../../../../kernel/iommu_groups/12"
    )
    assert read(root, "sys/kernel/iommu_groups/12/type") == "DMA-FQ\n"


def test_iommu_options_the_kernel_knows(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    refresh(root, cmdline="root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on iommu=pt")
    ht.boot_root(root, "kpro6")
    assert state(root)["iommu"]  # "on" is no amd_iommu option: ignored, logged
    assert "AMD-Vi: Unknown option - 'on'" in read(root, hwsim.DMESG)
    assert read(root, "sys/kernel/iommu_groups/12/type") == "identity\n"
    assert [p.name for p in (root / "sys/class/iommu").iterdir()]
    for off in ("amd_iommu=off", "iommu=off"):
        refresh(root, cmdline=f"root=ZFS=rpool/ROOT/pve-1 boot=zfs {off}")
        ht.boot_root(root, "kpro6")
        assert not state(root)["iommu"] and groups(root) == {}
        assert not list((root / "sys/class/iommu").iterdir())
        assert "Unknown option" not in read(root, hwsim.DMESG)
    refresh(root, cmdline="root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu.passthrough=1")
    ht.boot_root(root, "kpro6")
    assert read(root, "sys/kernel/iommu_groups/12/type") == "identity\n"


def test_intel_iommu_default_on_follows_the_profile(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "lumped")
    base = load_profile("lumped")
    quirks = base.quirks.model_copy(update={"intel_iommu_default_on": True})
    profile = base.model_copy(update={"quirks": quirks})
    boot.simulate_boot(root, profile)
    assert state(root)["iommu"] and groups(root)
    units = [p.name for p in (root / "sys/class/iommu").iterdir()]
    assert units and all(u.startswith("dmar") for u in units)
    refresh(root, cmdline="root=/dev/mapper/pve-root ro quiet intel_iommu=off")
    boot.simulate_boot(root, profile)
    assert not state(root)["iommu"] and groups(root) == {}


def test_sev_snp_withdrawn_with_the_iommu_off(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "sevsnp")
    refresh(root, cmdline="root=ZFS=rpool/ROOT/pve-1 boot=zfs amd_iommu=off")
    ht.boot_root(root, "sevsnp")
    assert read(root, "sys/module/kvm_amd/parameters/sev_snp") == "N\n"
    assert " sev_snp" in read(root, "proc/cpuinfo")  # the CPU still has it


# -- kernel choice --------------------------------------------------------------------------------------


@needs_build
def test_sev_snp_p2p_unsafe_and_identity_breaks_fsp(tmp_path: Path, cache: ht.ModuleCache) -> None:
    root = ht.make_root(tmp_path, "sevsnp")
    cache.install(root, KVER)
    ht.boot_root(root, "sevsnp")
    s = state(root)
    assert s["sev_snp_active"] and s["p2p_dma_safe"] is False
    assert read(root, "sys/module/kvm_amd/parameters/sev_snp") == "Y\n"
    assert "sev_snp" in read(root, "proc/cpuinfo")
    p2p = ht.run(root, "nvidia-smi", "topo", "-p2p", "r").stdout
    assert " GPU0\tX\tOK\tNS\tNS\t" in p2p  # the driver still says OK: the corruption is silent
    refresh(root, cmdline="root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet iommu=pt")
    ht.boot_root(root, "sevsnp")
    s = state(root)
    assert not s["sev_snp_active"]
    assert read(root, "sys/kernel/iommu_groups/53/type") == "identity\n"
    assert len(s["gpu_failed"]) == 4 and "0x177" in read(root, hwsim.DMESG)
    got = ht.run(root, "nvidia-smi", "-L")
    assert (got.returncode, got.stdout) == (6, "No devices were found\n")
    assert re.search(r"RmInitAdapter failed! \(0x62:0x177", read(root, hwsim.DMESG))
