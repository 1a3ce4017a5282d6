"""Converged re-run cost of the main deploy on twins, next to a one-operation pyinfra run.

    sudo .venv/bin/python benchmarks/rerun.py [--runs 5] [--fleet 1,4,8]

Prints, per fleet size: the median wall time of a converged `pyinfra -y inventory deploys/gpu_host.py`
run, the remote commands it sends per host (counted from pyinfra's debug log), and the same
figures for a one-operation deploy (`files.file` on one path) against the same twins, the two
run alternately.
Twins are started as twin1..N (kpro6 profile, simulated driver installed) and stopped after;
each gets inventory/kpro6.py's guests (CT 200 running with its six GPUs, VM 129 with two through
PCI mappings), so the re-run reads and compares the guests' entries too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from twin import driver, lifecycle, node

ROOT = Path(__file__).parents[1]
PYINFRA = Path(sys.executable).parent / "pyinfra"
ONE_OP = ROOT / "benchmarks" / "one_op.py"


def pyinfra_env() -> dict[str, str]:
    """The caller's environment, with Python's default bytecode caching: a
    PYTHONDONTWRITEBYTECODE there (some shells and CI images set it) would make every run
    compile the deploy's own modules again (deploys/, facts/: about 30 modules, 20-40 ms),
    which no user's repeated pyinfra run pays."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run(deploy: Path) -> tuple[float, int, str]:
    """(seconds, remote commands, output) of one pyinfra run on inventory/twin.py."""
    t0 = time.monotonic()
    proc = subprocess.run(
        # the twins only: inventory/twin.py lists their running containers as hosts too
        [str(PYINFRA), "-y", "--debug", "inventory/twin.py", str(deploy), "--limit", "twins"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=pyinfra_env(),
    )
    elapsed = time.monotonic() - t0
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        log = Path("/tmp/gpuhost-bench-failed.log")
        log.write_text(output)
        raise SystemExit(f"pyinfra failed (full output in {log}):\n{output[-3000:]}")
    return elapsed, output.count("Waiting for exit status"), output


def measure(deploys: tuple[Path, ...], runs: int, hosts: int) -> list[str]:
    """One line per deploy: runs alternate between them, so a machine that slows down or speeds
    up during the measurement weighs on each alike."""
    times: dict[Path, list[float]] = {d: [] for d in deploys}
    commands: dict[Path, set[int]] = {d: set() for d in deploys}
    for _ in range(runs):
        for deploy in deploys:
            elapsed, count, _ = run(deploy)
            times[deploy].append(elapsed)
            commands[deploy].add(count // hosts)
    return [
        f"median {statistics.median(times[d]):.2f} s (min {min(times[d]):.2f}), "
        f"{sorted(commands[d])} commands/host"
        for d in deploys
    ]


def guests(twin: node.Twin) -> None:
    """CT 200 and VM 129 as a user has them before gpuhost gives them their GPUs."""
    script = (
        "mkdir -p /etc/pve/lxc /etc/pve/qemu-server && "
        "printf 'arch: amd64\\nhostname: ct200\\nostype: debian\\n' > /etc/pve/lxc/200.conf && "
        "printf 'machine: q35\\nname: vm129\\n' > /etc/pve/qemu-server/129.conf"
    )
    ssh(twin, script)


def ssh(twin: node.Twin, command: str) -> None:
    ssh_output(twin, command)


def ssh_output(twin: node.Twin, command: str) -> str:
    return subprocess.run(
        ["ssh", "-F", str(node.ssh_config()), twin.address, command],
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    ).stdout


def stop_developer_twins() -> None:
    """Stop twin1..N only: test sessions' twins (index 200 up) belong to running tests."""
    for twin in node.list_twins():
        if twin.index < node.FIRST_TEST_INDEX:
            lifecycle.stop(twin.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fleet", default="1,4,8", help="fleet sizes, comma separated")
    args = parser.parse_args()
    deploy = ROOT / "deploys" / "gpu_host.py"
    for size in (int(n) for n in args.fleet.split(",")):
        stop_developer_twins()
        t0 = time.monotonic()
        twins = lifecycle.start_fleet(size, "kpro6")
        print(f"fleet of {size}: up in {time.monotonic() - t0:.1f} s", flush=True)
        for twin in twins:
            driver.install(twin, "595.71.05")
            guests(twin)
        first, _, _ = run(deploy)  # converge (reboots once)
        second, _, _ = run(deploy)  # the containers' entries after that boot
        for twin in twins:
            ssh(twin, "pct start 200")
        print(f"  first two (converging) runs:   {first:.2f} s, {second:.2f} s", flush=True)
        rerun, floor = measure((deploy, ONE_OP), args.runs, size)
        print(f"  converged gpu_host.py re-run:  {rerun}", flush=True)
        print(f"  one-operation deploy:          {floor}", flush=True)
    stop_developer_twins()
    return 0


if __name__ == "__main__":
    sys.exit(main())
