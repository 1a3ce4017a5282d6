"""Proxmox VE 9: the main deploy converges on kpro6 as it is after the upgrade, and the audit of
it with its guests passes.

The twin (profile kpro6-pve9) stands on the Debian 13 base: trixie's userland, kmod,
initramfs-tools and GRUB tools, pve-container 6, the PVE 9.0 kernel 6.14.8-2-pve built by
GCC 14.2.0. Its NVIDIA modules are built the way the host's would be: inside the trixie base,
with its gcc-14 against its kernel headers (stamped with the twin kernel's release).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.e2e.conftest import deploy
from tests.e2e.test_audit_twin import SPEC, audit, deploy_host, place_guests
from twin.hwtesting import ModuleCache, needs_root

KERNEL = "6.14.8-2-pve"
PVE9_SPEC = copy.deepcopy(SPEC)
# After the upgrade: PVE 9's packaged kernel (no source build), and the compiler that built it.
PVE9_SPEC["kernel"] = {"version": KERNEL}
PVE9_SPEC["toolchain"] = {"gcc": "14.2.0"}


@pytest.fixture(scope="module")
def trixie_modules(trixie_base: Path) -> ModuleCache:
    """NVIDIA-named .ko files built in the trixie base with gcc-14 (cached per machine)."""
    problem = needs_root()
    if problem:
        pytest.skip(problem)
    return ModuleCache(sysroot=trixie_base, cc="gcc-14")


def test_main_deploy_converges_on_pve9_and_the_audit_passes(
    fresh, trixie_modules, tmp_path: Path
) -> None:
    twin = fresh("kpro6-pve9")
    host = twin.host
    assert host.file("/etc/os-release").contains("VERSION_CODENAME=trixie")
    assert twin.run("dpkg-query -W -f '${Version}' pve-container")[1] == "6.0.11"
    assert host.file("/proc/version").contains(f"^Linux version {KERNEL} .*gcc.* 14\\.2\\.0")
    assert twin.run("gcc-14 -dumpfullversion")[1].strip() == "14.2.0"

    inv = tmp_path / "kpro6.py"
    first = deploy_host(twin, trixie_modules, inv, PVE9_SPEC)
    assert first.reboots == 1, first.output[-3000:]  # the trial boot of the new command line
    assert twin.host.file("/proc/driver/nvidia/version").contains("gcc version 14.2.0")
    second = deploy(inv)
    assert second.rc == 0, second.output[-3000:]
    assert second.reboots == 0 and not second.changed, second.output[-3000:]

    place_guests(twin)  # ct200 (trixie userland, pve-container 6 devN) and vm129 on vfio-pci
    assert "VERSION_CODENAME=trixie" in twin.run("pct exec 200 -- cat /etc/os-release")[1]
    failed = audit(twin, inv)
    assert failed == {}, json.dumps(failed, indent=1)
