"""gpuhost on Debian 13's Python 3.13 (issue 22, item 4): the unit tier, and the CLI against a
twin, run by python3.13 inside the twin's trixie base (tests/trixie_python.py), next to the rest
of the suite on this machine's 3.11. The venv has the wheels of the test venv's own versions."""

from __future__ import annotations

import re
from pathlib import Path

from tests.e2e.conftest import inventory, manifest
from tests.e2e.test_guest_inventory import CT200, SPEC, VM129, put
from tests.trixie_python import Bind, run
from twin import node

# Skips the 3.13 run may have: the captures older than a fact (as under 3.11), and the tests
# of real builds with Debian 12's compiler, gcc-12 against bookworm's kernel headers (the
# twin's hardware, driver modules, kernel recipes; the 3.11 run has them). Any other skip (a
# tool missing in the base, say) fails: it would hide a test from 3.13.
# promtool checks the exposition text gpuhost writes, the same bytes under any Python: the
# trixie layer leaves Prometheus (a large package) out and the Debian 12 run keeps those tests.
EXPECTED_SKIPS = re.compile(
    r"was captured before \w+ existed|gcc-1[12] not installed|needs gcc-12[ :]|promtool is missing"
)


def python313(lines: str) -> str:
    """A shell script that prints the interpreter first, then runs lines in the checkout."""
    return f"set -e\npython -VV\ncd /src\n{lines}"


def test_the_unit_tier_passes_under_python313(trixie_base: Path) -> None:
    done = run(
        trixie_base,
        ["sh", "-c", python313("python -m pytest -m unit -q -rs -p no:cacheprovider -n 2")],
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-6000:]
    assert done.stdout.startswith("Python 3.13."), done.stdout[:200]
    assert re.search(r"\b\d{3,} passed\b", done.stdout), done.stdout[-3000:]
    skips = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    unexpected = [line for line in skips if not EXPECTED_SKIPS.search(line)]
    assert not unexpected, "\n".join(unexpected)


def test_the_cli_and_guests_as_inventory_under_python313(
    fresh, trixie_base: Path, tmp_path: Path
) -> None:
    """`gpuhost plan` reads the live twin, the main deploy's change detection (--dry) runs every
    fact and operation, and the guests listed through proxmoxer over verified SSH (paramiko,
    gpuhost/pve/ssh.py; the openssh backend imported `pipes`, gone in 3.13) are hosts."""
    twin = fresh("kpro6")
    spec = {
        **SPEC,
        "guests": [
            {**g, "access": {"ssh_hostname": twin.twin.guest_address(200)}}
            if g["kind"] == "lxc"
            else g
            for g in SPEC["guests"]
        ],
    }
    host = inventory(tmp_path / "kpro6.py", twin, spec)
    guests = tmp_path / "guests.py"
    guests.write_text(
        host.read_text()
        + "from gpuhost.pve.guests import guests_of\n"
        + "guests = [g for g in guests_of(hosts[0]) if g[0] == 'ct200']\n"
    )
    put(twin, "/etc/pve/lxc/200.conf", CT200)
    put(twin, "/etc/pve/qemu-server/129.conf", VM129)
    rc, _, err = twin.run("pct start 200")
    assert rc == 0, err

    script = python313(
        f"gpuhost plan {host}\n"
        f"GPUHOST_PVE_TOKEN=$(cat {twin.twin.dir / 'api-token'}) pyinfra --dry {host} deploys/gpu_host.py\n"
        f"pyinfra -y -vvv {guests} --limit ct200 exec -- cat /etc/hostname\n"
    )
    binds = [Bind(tmp_path, str(tmp_path)), Bind(node.STATE_ROOT, str(node.STATE_ROOT))]
    before = manifest(twin.root)
    done = run(trixie_base, ["sh", "-c", script], binds, timeout=600)
    out = done.stdout
    assert done.returncode == 0, out[-6000:]
    assert out.startswith("Python 3.13."), out[:200]
    assert f"GPU plan for {twin.name}" in out, out[-6000:]
    assert "--> Detected changes:" in out, out[-6000:]  # the dry deploy's table: what it would do
    changes = out.split("--> Detected changes:", 1)[1]
    assert "/etc/modprobe.d/gpuhost-nvidia.conf" in changes, out[-6000:]
    assert manifest(twin.root) == before  # and did not
    assert re.search(r"\[ct200\]\s+ct200$", out, re.MULTILINE), out[-3000:]
    # the namespace took its mounts (overlays, proc, sysfs, binds) with it
    assert "gpuhost-py313" not in Path("/proc/self/mounts").read_text()
