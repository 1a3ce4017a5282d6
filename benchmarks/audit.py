"""The audit's cost: wall time and remote commands for a host and its GPU guests.

    .venv/bin/python benchmarks/audit.py --inventory inventory/twin.py [--host twin1] [--runs 5]
    python3 benchmarks/audit.py --inventory inventory/h200.py --local      (on the GPU machine)

Prints per run the wall time of reading the host and its containers (one command on the host,
one `pct exec` per GPU container) plus evaluating every check, then the median. The same code
the pytest suite runs; pytest's own start-up (about a second) is not included.
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpuhost.audit.connect import host_runner
from gpuhost.audit.observe import Runner
from gpuhost.audit.run import HostAudit, audit_all, gpu_containers, read_host
from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import load_inventory


def timed_runs(
    name: str, spec: HostSpec, run: Runner, sizes: tuple[int, ...], runs: int
) -> tuple[list[float], HostAudit]:
    """``runs`` audits (read, then every check evaluated), each run's line printed: the wall
    times, and the last audit (benchmarks/audit_twin.py too)."""
    times = []
    for i in range(runs):
        t0 = time.monotonic()
        audit = read_host(name, spec, run, None, sizes)
        outcomes = audit_all(audit)
        times.append(time.monotonic() - t0)
        failed = [o.check.id for o in outcomes if o.status == "failed"]
        print(
            f"run {i + 1}: {times[-1]:.2f} s, {audit.commands} remote command(s), "
            f"{len(outcomes)} checks ({len(failed)} failed{': ' + ', '.join(failed) if failed else ''})"
        )
    return times, audit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", required=True)
    parser.add_argument("--host")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--local", action="store_true", help="audit this machine (local://)")
    parser.add_argument("--p2p-sizes", default="4096,1048576,67108864")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.p2p_sizes.split(","))
    entries = load_inventory(args.inventory)
    name = args.host or next(iter(entries))
    spec, data = entries[name]
    run = host_runner(name, data, "local://" if args.local else None)  # None: its inventory address
    times, audit = timed_runs(name, spec, run, sizes, args.runs)
    guests = len(gpu_containers(spec))
    print(
        f"{name}: host + {guests} GPU container(s): median {statistics.median(times):.2f} s "
        f"over {args.runs} runs, {audit.commands} remote command(s) per audit"
    )


if __name__ == "__main__":
    main()
