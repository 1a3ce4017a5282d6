"""Reprovisioning a bricked host from the artifact store, on twins: time and compiler runs.

    sudo .venv/bin/python benchmarks/reprovision.py [--runs 3]

Builds (once per machine, cached) or finds the real test kernel's .debs
(tests/build/kernel_cache.py), provisions a fresh kpro6 twin once to fill the NVIDIA module
store (the modules compile on that twin), then wipes it: each run starts a new fresh twin and
runs `pyinfra -y <inventory> deploys/gpu_host.py` with the same spec and stores (kernel from the
store with dpkg, modules from the store, userspace and firmware from the NVIDIA installer,
trial boot, gate, pin). Prints each run's wall time and the compiler/make runs on the target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from tests.build.kernel_cache import built_kernel_store, missing
from tests.e2e.reprovision import provision
from twin.pytest_plugin import Fleet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    lacking = missing()
    if lacking:
        raise SystemExit(f"needs {', '.join(lacking)}")
    kernel = built_kernel_store()
    fleet = Fleet()
    started: list = []

    def start(profile: str):
        (handle,) = fleet.start(1, profile)
        started.append(handle)
        return handle

    try:
        tmp = Path(tempfile.mkdtemp(prefix="gpuhost-reprovision-"))
        first = provision(start, kernel, tmp, "first")
        if first.run.rc != 0:
            raise SystemExit(first.run.output[-3000:])
        print(
            f"first provisioning (builds the modules on the host): {first.seconds:.1f} s, "
            f"{len(first.compiler_runs)} compiler/make runs on the target"
        )
        fleet.stop(started.pop())
        times = []
        for i in range(args.runs):
            wiped = provision(start, kernel, tmp, f"wiped{i}")
            if wiped.run.rc != 0:
                raise SystemExit(wiped.run.output[-3000:])
            times.append(wiped.seconds)
            print(
                f"reprovision {i + 1}: {wiped.seconds:.1f} s, "
                f"{len(wiped.compiler_runs)} compiler/make runs on the target"
            )
            fleet.stop(started.pop())
        print(
            f"reprovision from the store: median {statistics.median(times):.1f} s over {args.runs}"
        )
    finally:
        fleet.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
