"""`gpuhost twin` provisions the twin it started, with that twin's spec, and no other twin.

Two twins of different profiles run; the command's deploy step (twin.demo.provision, the real
pyinfra CLI over SSH) targets the lumped one. Before, inventory/twin.py held every developer twin
and gave kpro6's spec to twins of any profile.
"""

from __future__ import annotations

import pytest

from twin import demo


def test_gpuhost_twin_deploys_to_the_started_twin_only(
    twin_fleet, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (kpro6,) = twin_fleet.start(1, "kpro6")
    (lumped,) = twin_fleet.start(1, "lumped")
    monkeypatch.setenv(demo.TARGET_ENV, "")  # restored after the test: provision sets it
    rc = demo.provision(lumped.twin, dry=True, with_driver=False)
    out = capfd.readouterr()
    text = out.out + out.err
    assert rc == 0, text
    assert f"[{lumped.name}]" in text and "ct300" in text  # lumped's spec: all GPUs to ct300
    assert kpro6.name not in text  # the other twin is not even connected to
