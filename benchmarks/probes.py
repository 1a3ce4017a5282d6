"""What the converged re-run's one batched fact read costs on a twin, probe by probe.

    sudo .venv/bin/python benchmarks/probes.py [--keep]

Starts twin1 (kpro6 profile, simulated driver, inventory/kpro6.py's guests, converged by two
deploy runs, CT 200 running) like benchmarks/rerun.py, then prints, each measured on the twin
itself (no SSH in the figures): every probe of the deploy's batched read run alone (median of 5),
their sum, and the batched read as the deploy runs it (all probes side by side; median of 5).
"""

from __future__ import annotations

import argparse
import shlex
import sys

from rerun import ROOT, guests, run, ssh_output, stop_developer_twins

from gpuhost.observe.hostfacts import FACTS, combined_args, fact_command, required_tool
from gpuhost.observe.snapshot import Combined, framed
from twin import driver, lifecycle

REPEAT = 5


def timed(command: str) -> str:
    """A remote script printing the median wall time (ms) of ``command`` over REPEAT runs."""
    quoted = shlex.quote(command)
    return (
        f"for i in $(seq {REPEAT}); do s=$(date +%s%N); sh -c {quoted} >/dev/null 2>&1; "
        "e=$(date +%s%N); echo $(( (e - s) / 1000000 )); done | sort -n | sed -n 3p"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave twin1 running")
    args = parser.parse_args()
    stop_developer_twins()
    (twin,) = lifecycle.start_fleet(1, "kpro6")
    driver.install(twin, "595.71.05")
    guests(twin)
    deploy = ROOT / "deploys" / "gpu_host.py"
    run(deploy)
    run(deploy)
    ssh_output(twin, "pct start 200")
    rows = []
    for key in FACTS:
        command = framed(fact_command(key), required_tool(key))
        rows.append((int(ssh_output(twin, timed(command)).strip()), key))
    for ms, key in sorted(rows, reverse=True):
        print(f"  {key:<22} {ms:5d} ms")
    print(f"  {'sum of probes':<22} {sum(ms for ms, _ in rows):5d} ms")
    batched = Combined().command(**combined_args())
    print(f"  {'batched read':<22} {int(ssh_output(twin, timed(batched)).strip()):5d} ms")
    if not args.keep:
        stop_developer_twins()
    return 0


if __name__ == "__main__":
    sys.exit(main())
