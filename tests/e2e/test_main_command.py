"""The README's main command: `gpuhost twin` starts a kpro6 twin and provisions it, twice."""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.conftest import PYINFRA, ROOT
from twin import lifecycle, node


def gpuhost_twin(*args: str) -> tuple[int, str]:
    run = subprocess.run(
        [str(PYINFRA.parent / "gpuhost"), "twin", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return run.returncode, run.stdout + run.stderr


def developer_twins() -> list[node.Twin]:
    """`gpuhost twin`'s own (below the test indexes; concurrent test sessions own the rest)."""
    return [t for t in node.list_twins() if t.index < node.FIRST_TEST_INDEX]


def test_gpuhost_twin_provisions_a_fresh_twin_then_changes_nothing(twin_base) -> None:
    if developer_twins():
        pytest.skip("a developer's twins are running; this test starts and stops its own twin1")
    try:
        rc, dry = gpuhost_twin("--dry")
        assert rc == 0, dry
        assert "starting a kpro6 twin" in dry and "Detected changes" in dry
        rc, first = gpuhost_twin()
        assert rc == 0, first
        # kpro6's command line and modules change: one trial boot of the running kernel
        assert first.count("passed its trial boot") == 1
        rc, again = gpuhost_twin()
        assert rc == 0 and "no reboot needed" in again
        assert "passed its trial boot" not in again and "rebooting" not in again
        (twin,) = developer_twins()
        uvm = twin.root / "sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
        assert uvm.read_text().strip() == "Y"
    finally:  # only the twin it started: other test sessions' twins keep running
        for twin in developer_twins():
            lifecycle.stop(twin.name)
