"""The twin's Proxmox packages in dpkg's database (what `dpkg-query -W pve-container` reads)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuhost.observe.containers import PveContainerVersion
from twin.pve import PACKAGES, _register_packages

STANZA = "Package: base-files\nStatus: install ok installed\nVersion: 12.4+deb12u5\n"


def test_registered_once_and_read_by_the_fact(tmp_path: Path) -> None:
    status = tmp_path / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text(STANZA)
    _register_packages(tmp_path)
    _register_packages(tmp_path)
    text = status.read_text()
    assert text.startswith(STANZA) and text.count("Package: pve-container\n") == 1
    assert f"Version: {PACKAGES['pve-container']}\n" in text
    if shutil.which("dpkg-query") is None:
        pytest.skip("no dpkg-query here")
    command = (
        PveContainerVersion()
        .command()
        .replace("dpkg-query", f"dpkg-query --admindir={status.parent}")
    )
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
    assert PveContainerVersion().process(out.splitlines()).version == PACKAGES["pve-container"]
