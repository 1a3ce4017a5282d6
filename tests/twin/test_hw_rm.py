"""The RM file the stand-in libcuda reads (twin/hwsim/rm.py) on temp roots, and the driver API
version per branch (twin/userspace.py); the libraries themselves run on twins (test_cuda.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from twin import hwsim, userspace
from twin import hwtesting as ht
from twin.hwsim.rm import RM_FILE
from twin.hwtesting import refresh

KVER = "6.8.12-9-pve"
SKIP = ht.missing_build_tools()
needs_build = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


@pytest.mark.parametrize(
    ("version", "api"),
    [("580.159.04", 13000), ("570.124.06", 12080), ("595.71.05", 13020), ("599.1", 13020)],
)
def test_driver_api_follows_the_branch(version: str, api: int) -> None:
    assert userspace.driver_api(version) == api


def test_a_branch_older_than_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match="branch 470"):
        userspace.driver_api("470.256.02")


def rm(root: Path) -> list[str]:
    return (root / RM_FILE).read_text().splitlines()


@needs_build
def test_rm_file_follows_the_kernel_state(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "sevsnp")
    ht.boot_root(root, "sevsnp")
    assert not (root / RM_FILE).exists()  # no driver installed: no nvidia module
    ht.ModuleCache().install(root, KVER)
    ht.boot_root(root, "sevsnp")
    lines = rm(root)
    assert lines[0] == f"version {ht.DRIVER}"
    assert not any(line.startswith("uvm_") for line in lines)  # nvidia_uvm not loaded yet
    gpus = [line.split()[1:3] for line in lines if line.startswith("gpu ")]
    assert gpus == [["0000:43:00.0", "0"], ["0000:44:00.0", "1"], ["0000:c3:00.0", "2"],
                    ["0000:c4:00.0", "3"]]  # fmt: skip
    # SEV-SNP, translated domains: P2P between peers the driver reports OK corrupts.
    assert "p2p 0000:43:00.0 0000:44:00.0 OK OK 1" in lines
    assert "p2p 0000:43:00.0 0000:c3:00.0 NS NS 1" in lines
    ht.write(root, "etc/modprobe.d/uvm.conf", "options nvidia_uvm uvm_disable_hmm=1\n")
    assert ht.run(root, "modprobe", "nvidia_uvm").returncode == 0
    major = ht.state(root)["majors"]["nvidia-uvm"]
    assert rm(root)[1:3] == [f"uvm_major {major}", "uvm_disable_hmm Y"]
    assert ht.run(root, "modprobe", "-r", "nvidia_uvm", "nvidia").returncode == 0
    assert not (root / RM_FILE).exists()


@needs_build
def test_identity_domains_on_snp_leave_no_cuda_gpu(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "sevsnp")
    ht.ModuleCache().install(root, KVER)
    refresh(root, cmdline="root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet iommu=pt")
    ht.boot_root(root, "sevsnp")
    assert len(ht.state(root)["gpu_failed"]) == 4  # FSP boot error 0x177: RM init failed
    assert not any(line.startswith(("gpu ", "p2p ")) for line in rm(root))


@needs_build
def test_without_snp_p2p_is_sound(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "h200x2")
    ht.ModuleCache().install(root, KVER)
    ht.boot_root(root, "h200x2")
    assert "p2p 0000:00:06.0 0000:00:07.0 OK OK 0" in rm(root)
    assert hwsim.Hw(root).loaded("nvidia")
