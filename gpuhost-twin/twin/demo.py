"""`gpuhost twin`: start a local twin if none runs, then provision it with the main deploy.

gpuhost-twin registers this as a gpuhost subcommand (entry-point group `gpuhost.commands`);
gpuhost itself never imports the simulator. It runs the deploy of the gpuhost checkout it finds
(inventory/twin.py, deploys/gpu_host.py) with the pyinfra next to the running python, on the
twin it started or found only (GPUHOST_TWIN_TARGET), with the spec of that twin's profile.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

INVENTORY = "inventory/twin.py"
TARGET_ENV = "GPUHOST_TWIN_TARGET"  # inventory/twin.py's: the one twin it holds
DEFAULT_PROFILE = "kpro6"


def add_command(sub: Any) -> argparse.ArgumentParser:
    """Add `twin` to gpuhost's subcommands (sub: argparse's subparsers action)."""
    twin = sub.add_parser("twin", help="provision a local simulated host (starts one if needed)")
    twin.add_argument(
        "--profile",
        default=None,
        help=f"hardware profile of a new twin (default {DEFAULT_PROFILE}); ignored when one runs",
    )
    twin.add_argument("--dry", action="store_true", help="show the plan and changes only")
    twin.add_argument(
        "--no-driver",
        dest="driver",
        action="store_false",
        help="leave the twin without an NVIDIA driver (default: simulate the spec's driver)",
    )
    twin.set_defaults(run=run)
    return twin


def run(args: argparse.Namespace) -> int:
    """Start a local twin if none runs, then provision that one twin with the main deploy."""
    from pyinfra.api.exceptions import PyinfraError

    from twin import lifecycle, node, processes
    from twin.errors import TwinError
    from twin.rootfs import RootfsError

    if os.geteuid() != 0:
        raise PyinfraError("twins need root (overlay mounts, chroot sshd): run with sudo")
    # developer twins only (inventory/twin.py's hosts): test sessions' twins (index >= 200) are theirs
    running = [t for t in node.list_twins() if t.index < node.FIRST_TEST_INDEX and node.is_up(t)]
    try:
        if not running:
            profile = args.profile or DEFAULT_PROFILE
            if profile not in spec_profiles():  # refused before a twin is started for nothing
                raise PyinfraError(
                    f"--profile {profile}: {INVENTORY} has specs only for "
                    f"{', '.join(spec_profiles())}; add one to SPECS there, or pick one of those"
                )
            print(f"starting a {profile} twin...", file=sys.stderr)
            running = lifecycle.start_fleet(1, profile)
        else:
            problem = processes.port_22_problem()
            if problem:
                raise TwinError(problem)
    except (TwinError, RootfsError) as exc:
        raise PyinfraError(str(exc)) from None
    twin = running[0]
    if args.profile is not None and args.profile != (twin.profile or "bare"):
        print(
            f"--profile {args.profile} ignored: {twin.name} already runs as "
            f"{twin.profile or 'bare'} and is provisioned as it is; for a {args.profile} twin "
            f"stop it first (python -m twin stop {twin.name})",
            file=sys.stderr,
        )
    return provision(twin, dry=args.dry, with_driver=args.driver)


def spec_profiles() -> list[str]:
    """The hardware profiles inventory/twin.py has a spec for."""
    return list(runpy.run_path(str(_checkout() / INVENTORY))["SPECS"])


def provision(twin: Any, dry: bool, with_driver: bool = True) -> int:
    """Run the main deploy on ``twin`` alone (a twin.node.Twin), with the spec of its profile."""
    from gpuhost.spec.inventory import load_inventory
    from twin import driver

    os.environ[TARGET_ENV] = twin.name  # inventory/twin.py then holds this twin only
    spec, _ = load_inventory(_checkout() / INVENTORY)[twin.name]
    if with_driver and driver.install(twin, spec.driver.version):
        print(
            f"{twin.name}: simulated NVIDIA driver {spec.driver.version} installed", file=sys.stderr
        )
    pyinfra = Path(sys.executable).parent / "pyinfra"
    # --dry without -y: pyinfra then runs change detection and lists what would change
    command = [str(pyinfra), "--dry" if dry else "-y", INVENTORY, "deploys/gpu_host.py"]
    print(f"{TARGET_ENV}={twin.name} {' '.join(command)}", file=sys.stderr)
    return subprocess.run(command, cwd=_checkout()).returncode


def _checkout() -> Path:
    import gpuhost

    return Path(gpuhost.__file__).resolve().parents[1]
