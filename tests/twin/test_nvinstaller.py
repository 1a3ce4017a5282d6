"""The stand-in NVIDIA installer (twin/nvinstaller.py): the real file name and flags, refusals
like the real one's, and the layout of its payload. Its install is tested on a twin by
tests/e2e/test_driver_userspace.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from twin.modbuild import firmware_blob
from twin.nvinstaller import build_installer

VERSION = "595.71.05"


def run(installer: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", str(installer), *args], cwd=cwd, capture_output=True, text=True, check=False
    )


def test_name_flags_and_refusals(tmp_path: Path) -> None:
    installer = build_installer(VERSION, tmp_path)
    assert installer.name == f"NVIDIA-Linux-x86_64-{VERSION}.run"
    bad = run(installer, "--silent", "--no-kernel-modules", "--frobnicate", cwd=tmp_path)
    assert (
        bad.returncode == 1
        and 'nvidia-installer: unrecognized option: "--frobnicate"' in bad.stderr
    )
    modules = run(installer, "--silent", "--accept-license", cwd=tmp_path)
    assert modules.returncode == 1 and "cannot build kernel modules" in modules.stderr
    assert "--no-kernel-modules" in modules.stderr
    version = run(installer, "--version", cwd=tmp_path)
    assert version.returncode == 0 and VERSION in version.stdout


def test_extract_only_gives_the_payload(tmp_path: Path) -> None:
    installer = build_installer(VERSION, tmp_path)
    done = run(installer, "-x", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    top = tmp_path / f"NVIDIA-Linux-x86_64-{VERSION}"
    assert sorted(str(p.relative_to(top)) for p in top.rglob("*") if p.is_file()) == [
        "firmware/gsp_ga10x.bin",
        "firmware/gsp_tu10x.bin",
        f"libcuda.so.{VERSION}",
        f"libnvidia-ml.so.{VERSION}",
        "nvidia-persistenced",
        "nvidia-smi",
    ]
    assert (top / "firmware/gsp_ga10x.bin").read_bytes() == firmware_blob(VERSION)
    # Its nvidia-smi asks the driver (the twin's RM file); on a machine without one it says so
    # as the real one does. Inside twin containers it is exercised by tests/e2e/test_containers.
    if not Path("/proc/driver/gpuhost-twin-rm").exists():
        smi = subprocess.run([str(top / "nvidia-smi"), "-L"], capture_output=True, text=True)
        assert smi.returncode == 9 and "couldn't communicate with the NVIDIA driver" in smi.stdout
    soname = subprocess.run(
        ["objdump", "-p", str(top / f"libcuda.so.{VERSION}")], capture_output=True, text=True
    )
    assert soname.returncode != 0 or "SONAME               libcuda.so.1" in soname.stdout
