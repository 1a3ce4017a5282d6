"""The audit's cost on a kpro6 twin: the host and its two guests (ct200 with 6 GPUs, vm129 with 2).

    sudo .venv/bin/python benchmarks/audit_twin.py [--runs 5]

Starts a kpro6 twin (test index 250), deploys it and puts its GPU split in place as the e2e audit
test does, then audits it --runs times through testinfra over SSH (`pct exec` into ct200) and
prints each run's wall time, the remote commands per audit and the median. Stops the twin after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
os.environ.setdefault("GPUHOST_TWIN_TEST_INDEX", "250")

from benchmarks.audit import timed_runs
from gpuhost.audit.connect import host_runner
from gpuhost.spec.inventory import load_inventory
from tests.e2e.guests import provision
from twin.hwtesting import ModuleCache
from twin.pytest_plugin import Fleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--p2p-sizes", default="4096,1048576,67108864")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.p2p_sizes.split(","))
    fleet = Fleet()
    (twin,) = fleet.start(1, "kpro6")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            inv = provision(twin, ModuleCache(), Path(tmp) / "kpro6.py")
            name, (spec, data) = next(iter(load_inventory(inv).items()))
            run = host_runner(name, data, f"ssh://root@{twin.address}:22")
            times, audit = timed_runs(name, spec, run, sizes, args.runs)
            print(
                f"kpro6 twin, host + ct200 (6 GPUs) + vm129 (2 GPUs), P2P sizes {sizes}: "
                f"median {statistics.median(times):.2f} s over {args.runs} runs, "
                f"{audit.commands} remote commands per audit"
            )
    finally:
        fleet.stop(twin)


if __name__ == "__main__":
    main()
