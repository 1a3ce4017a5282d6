"""Trial boot of a new kernel by the main deploy, on twins of each boot path (experimental)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ROOT, deploy, inventory
from twin import hardware, userspace
from twin.modbuild import GSP_FIRMWARE
from twin.profile import Kernel

pytestmark = pytest.mark.twin

TREE = ROOT / "tests/fixtures/driver-src/open-gpu-kernel-modules"
OLD = "6.8.12-9-pve"
NEW = "6.14.8-2-bpo12-pve"
GCC = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"
VERSION = "595.71.05"


def fresh_profile(tmp: Path, base: str = "kpro6", **boot) -> str:
    data = yaml.safe_load((ROOT / f"gpuhost-twin/twin/profiles/{base}.yaml").read_text())
    data["kernels"] = [{"version": OLD, "gcc": GCC}]
    data["boot"].update(boot)
    path = tmp / f"{base}-fresh.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_systemd_boot_trial(fresh, tmp_path):
    twin = fresh(fresh_profile(tmp_path))
    hardware.add_kernel(twin.root, Kernel(version=NEW, gcc=GCC))
    assert twin.run(f"update-initramfs -c -k {NEW}")[0] == 0
    userspace.install_root(twin.root, VERSION)
    fw = twin.root / f"lib/firmware/nvidia/{VERSION}"
    fw.mkdir(parents=True)
    for blob in GSP_FIRMWARE:
        (fw / blob).write_bytes(b"twin GSP firmware " + VERSION.encode() + b"\n")
    spec = {
        "kernel": {"version": NEW, "keep": [OLD]},
        "toolchain": {"gcc": "12.2.0"},
        "driver": {
            "version": VERSION,
            "source": {"tree": str(TREE), "store": str(tmp_path / "store")},
        },
    }
    inv = inventory(tmp_path / "inv.py", twin, spec)
    first = deploy(inv)
    print(first.output)
    assert first.rc == 0, first.output
    second = deploy(inv)
    print(second.output)
    assert second.rc == 0
    assert not second.changed
