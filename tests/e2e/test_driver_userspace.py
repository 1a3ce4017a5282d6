"""The NVIDIA userspace deploy on a twin, for real: a twin without any driver gets the open
modules built on it (tests/fixtures/driver-src) and the userspace and GSP firmware from the
stand-in `NVIDIA-Linux-x86_64-<ver>.run` (twin/nvinstaller.py: the real name, flags and
layout), run with --no-kernel-modules; after the reboot the nvidia module loads with its
firmware, and a second run changes nothing. An installer of another version is refused before
anything changes, and one whose file name lies is caught by the check after it ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import ROOT, Deploy, deploy, inventory, manifest
from tests.e2e.test_driver_install import KERNEL, TREE, VERSION
from twin.nvinstaller import build_installer
from twin.pytest_plugin import TwinHandle

LIBDIR = "usr/lib/x86_64-linux-gnu"
UNIT = "etc/systemd/system/gpuhost-nvidia-persistenced.service"
WANTS = "etc/systemd/system/multi-user.target.wants/gpuhost-nvidia-persistenced.service"


def spec(store: Path, installer: Path) -> dict:
    source = {"tree": str(TREE), "store": str(store), "installer": str(installer)}
    return {"kernel": {"version": KERNEL}, "driver": {"version": VERSION, "source": source}}


def userspace(twin: TwinHandle) -> list[str]:
    libdir = twin.root / LIBDIR
    return sorted(
        p.name for lib in ("libcuda", "libnvidia-ml") for p in libdir.glob(f"{lib}.so.*.*")
    )


def test_installed_at_the_version_before_the_reboot_then_converged(fresh, tmp_path):
    twin = fresh("h200x2")
    installer = build_installer(VERSION, tmp_path / "nvidia")
    inv = inventory(tmp_path / "inv.py", twin, spec(tmp_path / "store", installer))

    done: Deploy = deploy(inv)
    assert done.rc == 0, done.output
    assert f"NVIDIA {VERSION} userspace and GSP firmware" in done.output
    assert userspace(twin) == [f"libcuda.so.{VERSION}", f"libnvidia-ml.so.{VERSION}"]
    assert sorted(p.name for p in (twin.root / f"lib/firmware/nvidia/{VERSION}").iterdir()) == [
        "gsp_ga10x.bin",
        "gsp_tu10x.bin",
    ]
    assert (twin.root / "usr/bin/nvidia-persistenced").is_file()
    assert (
        "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced"
        in (twin.root / UNIT).read_text()
    )
    assert (twin.root / WANTS).readlink() == Path("/" + UNIT)
    assert twin.run("getent passwd nvidia-persistenced")[0] == 0
    assert not list((twin.root / f"lib/modules/{KERNEL}").rglob("*.ko.run*"))
    assert not (twin.root / "var/lib/gpuhost/pending-userspace").exists()
    assert not (twin.root / "var/lib/gpuhost/driver-installer" / installer.name).exists()
    # The run rebooted (the planned command line); the driver came up with its firmware.
    assert done.reboots == 1, done.output
    rc, out, err = twin.run("cat /proc/driver/nvidia/version")
    assert rc == 0 and f"Open Kernel Module for x86_64  {VERSION}" in out, out + err
    rc, out, err = twin.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert rc == 0 and out.split() == [VERSION, VERSION], out + err

    # The audit's driver checks, against the same spec, pass on what the deploy left.
    audit = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuhost.cli",
            "audit",
            str(inv),
            "--json",
            str(tmp_path / "a.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = json.loads((tmp_path / "a.json").read_text())["results"]
    status = {r["check"]: r["status"] for r in results}
    for check in ("driver.version", "driver.firmware", "driver.userspace", "driver.next_boot"):
        assert status[check] == "passed", audit.stdout[-3000:]

    again = deploy(inv)
    assert again.rc == 0, again.output
    assert not again.changed, again.output
    assert f"NVIDIA {VERSION} userspace and GSP firmware (no kernel modules)" in again.output


def test_another_version_is_refused_before_anything_changes(fresh, tmp_path):
    twin = fresh("h200x2")
    other = build_installer("595.71.04", tmp_path / "nvidia")
    before = manifest(twin.root)
    done = deploy(inventory(tmp_path / "inv.py", twin, spec(tmp_path / "store", other)))
    assert done.rc != 0, done.output
    assert "driver.source.installer" in done.output
    assert "it installs driver 595.71.04, but driver.version is 595.71.05" in done.output
    assert manifest(twin.root) == before


def test_a_misnamed_installer_fails_the_check_after_it_ran(fresh, tmp_path):
    twin = fresh("h200x2")
    # The file name says 595.71.05; what it installs is 595.71.04.
    liar = build_installer(
        "595.71.04", tmp_path / "nvidia", name=f"NVIDIA-Linux-x86_64-{VERSION}.run"
    )
    done = deploy(inventory(tmp_path / "inv.py", twin, spec(tmp_path / "store", liar)), "-y")
    assert done.rc != 0, done.output
    assert "wanted driver 595.71.05" in done.output and "595.71.04" in done.output
    assert done.reboots == 0
    # Marked pending: the next run installs again rather than trusting what it finds.
    assert (twin.root / "var/lib/gpuhost/pending-userspace").exists()
