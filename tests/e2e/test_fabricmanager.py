"""nvidia-fabricmanager on an NVSwitch twin (the hgx-h200 profile: 8x H200 and four NVSwitches),
through the real pyinfra CLI: a twin without any driver gets the modules, the userspace and the
fabric manager package of the driver's version (a real .deb, twin/fabricmanager.py, installed
with dpkg); its service is enabled and the boot starts it, which configures the fabric, and
only then does CUDA initialise (before, CUDA_ERROR_SYSTEM_NOT_READY); the audit's
driver.fabricmanager and cuda.host pass and a second run changes nothing. A package of another
version is refused before anything changes, also when its file name lies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import ROOT, deploy, inventory, manifest
from tests.e2e.test_driver_install import KERNEL, TREE, VERSION
from twin.fabricmanager import build_fabricmanager, deb_name
from twin.nvinstaller import build_installer
from twin.pytest_plugin import TwinHandle

UNIT = "nvidia-fabricmanager.service"
SMALL = ("--p2p-sizes", "4096")


def spec(tmp: Path, fabricmanager: Path | None) -> dict:
    nvidia = tmp / "nvidia"
    installer = nvidia / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    if not installer.exists():
        build_installer(VERSION, nvidia)
    source = {"tree": str(TREE), "store": str(tmp / "store"), "installer": str(installer)}
    if fabricmanager is not None:
        source["fabricmanager"] = str(fabricmanager)
    return {"kernel": {"version": KERNEL}, "driver": {"version": VERSION, "source": source}}


def audit(inv: Path, out: Path) -> dict[str, dict]:
    # One small P2P copy size: the data check's copies between the eight GPUs at the default
    # sizes (up to 64 MiB, each pair also staged through host memory) took most of the test's
    # time, and no assertion here reads them.
    subprocess.run(
        [sys.executable, "-m", "gpuhost.cli", "audit", str(inv), "--json", str(out), *SMALL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return {r["check"]: r for r in json.loads(out.read_text())["results"]}


def package(twin: TwinHandle) -> str:
    rc, out, _ = twin.run("dpkg-query -W -f '${db:Status-Abbrev}${Version}' nvidia-fabricmanager")
    return out.strip() if rc == 0 else ""


def test_installed_started_at_boot_and_cuda_waits_for_it(fresh, tmp_path):
    twin = fresh("hgx-h200")
    deb = build_fabricmanager(VERSION, tmp_path / "nvidia")
    assert deb.name == f"nvidia-fabricmanager_{VERSION}-1_amd64.deb"

    # Without the package the plan is refused: the switches are on the bus.
    before = manifest(twin.root)
    refused = deploy(inventory(tmp_path / "bare.py", twin, spec(tmp_path, None)))
    assert refused.rc != 0 and "driver.source.fabricmanager: required" in refused.output
    assert "0000:07:00.0" in refused.output and manifest(twin.root) == before

    inv = inventory(tmp_path / "inv.py", twin, spec(tmp_path, deb))
    first = deploy(inv)
    assert first.rc == 0, first.output[-5000:]
    assert f"nvidia-fabricmanager {VERSION} (4 NVSwitches)" in first.output
    assert package(twin) == f"ii {VERSION}-1"  # dpkg's own record
    assert (twin.root / "usr/bin/nv-fabricmanager").is_file()
    assert (twin.root / "usr/share/nvidia/nvswitch/fabricmanager.cfg").is_file()
    wants = twin.root / f"etc/systemd/system/multi-user.target.wants/{UNIT}"
    target = twin.root / str(wants.readlink()).lstrip("/")  # /lib or /usr/lib (usrmerge)
    assert target.samefile(twin.root / f"lib/systemd/system/{UNIT}")
    assert first.reboots == 1, first.output[-3000:]
    # The boot ran the unit: the fabric manager configured the switches on the new driver.
    status = twin.run(f"systemctl status {UNIT}")[1]
    assert twin.run(f"systemctl is-active {UNIT}")[1].strip() == "active", status
    assert twin.run("gpuhost-twin-fabric state")[1].strip() == "completed"
    assert "Successfully configured" in (twin.root / "var/log/fabricmanager.log").read_text()
    results = audit(inv, tmp_path / "a.json")
    for check in ("driver.fabricmanager", "driver.version", "cuda.host"):
        assert results[check]["status"] == "passed", results[check]
    again = deploy(inv)
    assert again.rc == 0 and not again.changed, again.output[-3000:]

    # A boot without the fabric manager: the fabric stays "In Progress", CUDA is not ready.
    assert twin.run(f"systemctl disable {UNIT}")[0] == 0
    twin.reboot()
    assert twin.run("gpuhost-twin-fabric state")[1].strip() == "in_progress"
    results = audit(inv, tmp_path / "b.json")
    assert results["driver.fabricmanager"]["status"] == "failed"
    assert "CUDA_ERROR_SYSTEM_NOT_READY" in json.dumps(results["cuda.host"])
    # The deploy enables it again and starts it on the loaded driver of its version.
    fixed = deploy(inv)
    assert fixed.rc == 0 and fixed.reboots == 0, fixed.output[-3000:]
    assert twin.run("gpuhost-twin-fabric state")[1].strip() == "completed"
    assert audit(inv, tmp_path / "c.json")["cuda.host"]["status"] == "passed"
    assert not deploy(inv).changed


def test_another_version_is_refused_before_anything_changes(fresh, tmp_path):
    twin = fresh("hgx-h200")
    before = manifest(twin.root)
    # Named for another driver: refused with the spec, before anything connects.
    other = build_fabricmanager("595.71.04", tmp_path / "nvidia")
    named = deploy(inventory(tmp_path / "a.py", twin, spec(tmp_path, other)))
    assert named.rc != 0 and "driver.source.fabricmanager" in named.output
    assert "it is fabric manager 595.71.04, but driver.version is 595.71.05" in named.output
    # Named right, but the package inside is another version: refused while the run prepares.
    liar = build_fabricmanager("595.71.04", tmp_path / "liar", name=deb_name(VERSION))
    lied = deploy(inventory(tmp_path / "b.py", twin, spec(tmp_path, liar)))
    assert lied.rc != 0
    assert "the package inside is nvidia-fabricmanager 595.71.04-1" in lied.output
    assert manifest(twin.root) == before
    assert package(twin) == ""
