"""Converged re-run cost of the guest deploy on a kpro6 twin's container 200.

    sudo .venv/bin/python benchmarks/guest_rerun.py [--runs 5]

Starts one kpro6 twin (index GPUHOST_TWIN_TEST_INDEX, default 200) with a simulated driver and
CT 200, serves the stand-in CUDA repository (twin/cudarepo.py), converges the guest (two CUDA
toolkits, one venv with a pin from the package index this machine is configured with, one
service), then prints the median wall time and remote commands of a converged
`pyinfra -y INV deploys/gpu_guest.py --limit ct200` re-run, of a converged gpu_host.py re-run
on the node, and of a one-operation deploy on the guest (the floor), and stops the twin.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from rerun import pyinfra_env

from gpuhost.spec.inventory import load_inventory
from tests.e2e.test_guest_software import CT200, SPEC, guest_spec, write_inventory
from twin import cudarepo, driver, lifecycle, node
from twin.pytest_plugin import TwinHandle

ROOT = Path(__file__).parents[1]
PYINFRA = Path(sys.executable).parent / "pyinfra"
ONE_OP = ROOT / "benchmarks" / "one_op.py"


def run(inv: Path, deploy: Path, limit: str | None) -> tuple[float, int, str]:
    args = [str(PYINFRA), "-y", "--debug", str(inv), str(deploy)]
    if limit:
        args += ["--limit", limit]
    t0 = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=pyinfra_env())
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"pyinfra failed:\n{out[-3000:]}")
    return elapsed, out.count("Waiting for exit status"), out


def measure(inv: Path, deploy: Path, limit: str | None, runs: int) -> str:
    times, commands = [], set()
    for _ in range(runs):
        elapsed, count, _ = run(inv, deploy, limit)
        times.append(elapsed)
        commands.add(count)
    return f"median {statistics.median(times):.2f} s (min {min(times):.2f}), commands {sorted(commands)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    first = int(os.environ.get("GPUHOST_TWIN_TEST_INDEX", node.FIRST_TEST_INDEX))
    (twin,) = lifecycle.start_fleet(1, "kpro6", first=first)
    handle = TwinHandle(twin.address, twin=twin)
    try:
        driver.install(twin, "595.71.05")
        rc, _, err = handle.run(
            f"mkdir -p /etc/pve/lxc && printf '{CT200}' > /etc/pve/lxc/200.conf && pct start 200"
        )
        assert rc == 0, err
        with tempfile.TemporaryDirectory() as tmp:
            repo = cudarepo.build(Path(tmp) / "cuda", ["12.8", "13.0"])
            with cudarepo.serve(repo.root) as url:
                inv = Path(tmp) / "kpro6.py"
                write_inventory(inv, handle, guest_spec(SPEC, handle, repo, url))
                load_inventory(inv)
                guest = ROOT / "deploys/gpu_guest.py"
                converge, _, _ = run(inv, guest, "ct200")
                print(f"first (converging) guest run: {converge:.2f} s", flush=True)
                run(inv, ROOT / "deploys/gpu_host.py", twin.name)  # converge the node too
                print(f"converged gpu_guest.py re-run:  {measure(inv, guest, 'ct200', args.runs)}")
                print(
                    "converged gpu_host.py re-run:   "
                    f"{measure(inv, ROOT / 'deploys/gpu_host.py', twin.name, args.runs)}"
                )
                print(f"one-operation deploy on ct200: {measure(inv, ONE_OP, 'ct200', args.runs)}")
    finally:
        lifecycle.stop(twin.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
