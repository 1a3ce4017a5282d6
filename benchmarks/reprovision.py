"""Reprovisioning a bricked host from the artifact store, on twins: time and compiler runs.

    sudo .venv/bin/python benchmarks/reprovision.py [--runs 3] [--build-host]

Builds (once per machine, cached) or finds the real test kernel's .debs
(tests/build/kernel_cache.py), provisions a fresh kpro6 twin once to fill the NVIDIA module
store (the modules compile on that twin), then wipes it: each run starts a new fresh twin and
runs `pyinfra -y <inventory> deploys/gpu_host.py` with the same spec and stores (kernel from the
store with dpkg, modules from the store, userspace and firmware from the NVIDIA installer,
trial boot, gate, pin). Prints each run's wall time and the compiler/make runs on the target.

With --build-host the kernel's store is a build host's (artifacts.build_host: this machine
behind its own sshd, tests/build/sshd.py) and every reprovision starts with an empty mirror, so
each one lists the store over SSH and fetches and verifies the .debs (a new control machine).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from tests.build.kernel_cache import built_kernel_store, missing
from tests.build.sshd import local_build_host
from tests.e2e.reprovision import provision
from twin.pytest_plugin import Fleet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--build-host", action="store_true", help="the store on a build host")
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

    with ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="gpuhost-reprovision-"))
        stack.callback(fleet.stop_all)
        artifacts, builders = None, ""
        if args.build_host:
            builder = stack.enter_context(local_build_host(tmp / "builder"))
            builders = builder.entry("builder")
            mirror = tmp / "mirror"
            artifacts = {"store": str(kernel.store), "build_host": "builder", "mirror": str(mirror)}
        first = provision(start, kernel, tmp, "first", artifacts, builders)
        if first.run.rc != 0:
            raise SystemExit(first.run.output[-3000:])
        print(
            f"first provisioning (builds the modules on the host): {first.seconds:.1f} s, "
            f"{len(first.compiler_runs)} compiler/make runs on the target"
        )
        fleet.stop(started.pop())
        times = []
        for i in range(args.runs):
            if args.build_host:
                shutil.rmtree(mirror, ignore_errors=True)
            wiped = provision(start, kernel, tmp, f"wiped{i}", artifacts, builders)
            if wiped.run.rc != 0:
                raise SystemExit(wiped.run.output[-3000:])
            times.append(wiped.seconds)
            print(
                f"reprovision {i + 1}: {wiped.seconds:.1f} s, "
                f"{len(wiped.compiler_runs)} compiler/make runs on the target"
            )
            fleet.stop(started.pop())
        where = "the build host's store (empty mirror)" if args.build_host else "the store"
        print(f"reprovision from {where}: median {statistics.median(times):.1f} s over {args.runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
