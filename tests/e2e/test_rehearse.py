"""`gpuhost rehearse` end to end: kpro6's saved snapshot (examples/kpro6-facts) made into a twin,
inventory/kpro6.py's spec deployed on it, the audit, a second run with no change; and nothing
connects to the host the inventory names (its addresses here are TEST-NET ones that answer
nothing: a connection would fail the run).

One twin, about half a minute on 2 cores (the wall time is printed with -s)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpuhost.spec.inventory import load_inventory
from twin import lifecycle, node, rehearse_setup
from twin.pytest_plugin import Fleet

ROOT = Path(__file__).parents[2]
FACTS = ROOT / "examples/kpro6-facts"
UNREACHABLE = "192.0.2."  # TEST-NET-1 (RFC 5737): never routed


def kpro6_elsewhere(path: Path) -> Path:
    """inventory/kpro6.py's spec for a host whose every address answers nothing: its SSH, its
    Proxmox API (with a token variable that is not set) and its container's SSH."""
    spec, _ = load_inventory(ROOT / "inventory/kpro6.py")["kpro6"]
    data = spec.model_dump(mode="json")
    data["proxmox"] = {"address": f"{UNREACHABLE}1", "token_env": "GPUHOST_TEST_NO_TOKEN"}
    ct200 = next(g for g in data["guests"] if g["kind"] == "lxc")
    ct200["access"] = {"ssh_hostname": f"{UNREACHABLE}2"}
    path.write_text(
        "from gpuhost.spec.inventory import gpu_host\n"
        f"hosts = [gpu_host('kpro6', {data!r}, ssh_hostname='{UNREACHABLE}1', ssh_user='root')]\n"
    )
    return path


def test_rehearse_kpro6_from_its_snapshot(twin_fleet: Fleet, tmp_path: Path) -> None:
    index = twin_fleet._first_free(1)  # the session's own range (GPUHOST_TWIN_TEST_INDEX)
    name = node.twin_name(index)
    lifecycle.stop(name)  # a leftover of a killed earlier run, as the fleet does
    twin_fleet.started.append(name)  # stopped at the session's end whatever happens here
    inventory = kpro6_elsewhere(tmp_path / "kpro6.py")
    t0 = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "twin.rehearse", str(inventory), "--facts", str(FACTS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=420,
        env={**os.environ, rehearse_setup.INDEX_ENV: str(index)},
    )
    wall = time.monotonic() - t0
    out = run.stdout
    assert "\nprofile: " in out, run.stdout + run.stderr
    where = Path(next(ln for ln in out.splitlines() if ln.startswith("profile: "))[9:]).parent
    try:
        print(f"\nrehearse kpro6-facts: {wall:.1f} s wall\n{out}")
        sections = _sections(out)
        # the plan is the twin's (the deploy's own); kpro6's snapshot had no guests yet
        assert sections["plan (from the twin's facts)"][0] == "GPU plan for kpro6"
        assert any(
            "vm 129 (vm129) has no config" in ln for ln in sections["plan (from the twin's facts)"]
        )
        # the deploy ran through; its one boot was the trial of the new command line, passed
        deploy = sections["deploy: what ran"][0]
        assert ", 0 failed (exit 0;" in deploy, out
        boots = sections["reboots and trial boots"]
        assert any("rebooting into the new boot configuration" in ln for ln in boots), boots
        assert any("passed its trial boot" in ln for ln in boots), boots
        # the audit ran and says what the host still lacks: the inventory's driver (595.71.05;
        # no installer given, the capture's 580.95.05 stays) and the guests nobody created
        audit = sections["audit"]
        assert "passed" in audit[0] and "failed" in audit[0], audit
        failed = {ln.split()[0] for ln in audit[1:]}
        assert "driver.version" in failed and "vm.machine" in failed, audit
        assert not failed & {"boot.cmdline", "modules.parameters", "gpus.binding"}, audit
        assert sections["second run"] == ["0 changes (converged)"]
        assert run.returncode == 1  # converged, but the audit names what is left
        figures = sections["figures"]
        assert figures[-1].startswith("capture to converged twin: ")
        # nothing but the twin was named to pyinfra or the audit, and the read was the snapshot
        generated = (where / "inventory.py").read_text()
        assert UNREACHABLE not in generated and f"ssh_hostname='127.0.0.{index + 1}'" in generated
        assert (where / "profile.yaml").is_file() and (where / "snapshot/PciDevices.out").is_file()
        for log in ("deploy-1.log", "deploy-2.log", "audit.log"):
            assert UNREACHABLE not in (where / log).read_text(), log
        assert f"python -m twin start --first {index} --profile {where}/profile.yaml" in out
    finally:
        lifecycle.stop(name)
        twin_fleet.started.remove(name)
        shutil.rmtree(where, ignore_errors=True)


def _sections(out: str) -> dict[str, list[str]]:
    """The report's "== title" sections, their lines without blank ones."""
    found: dict[str, list[str]] = {}
    current: list[str] = []
    for line in out.splitlines():
        if line.startswith("== "):
            current = found.setdefault(line[3:], [])
        elif line.strip():
            current.append(line)
    return found
