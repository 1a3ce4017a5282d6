"""`gpuhost twin`: start a local twin if none runs, then provision it as the real host would be.

gpuhost-twin registers this as a gpuhost subcommand (entry-point group `gpuhost.commands`);
gpuhost itself never imports the simulator. A new twin first gets what the real host had before
gpuhost ran: an NVIDIA driver (simulated), the guests its spec names (twin/demo_guests.py). Then
it runs the deploys of the gpuhost checkout it finds with the pyinfra next to the running python:
deploys/gpu_host.py on the twin it started or found only (GPUHOST_TWIN_TARGET, --limit), with
the spec of that twin's profile (inventory/twin.py), then deploys/gpu_guest.py on its containers.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import time
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
            say(f"starting a {profile} twin...")
            t0 = time.monotonic()
            running = lifecycle.start_fleet(1, profile)
            say(f"{running[0].name} up in {time.monotonic() - t0:.0f} s, at {running[0].address}")
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
    try:
        return provision(twin, dry=args.dry, with_driver=args.driver)
    except TwinError as exc:
        raise PyinfraError(str(exc)) from None


def spec_profiles() -> list[str]:
    """The hardware profiles inventory/twin.py has a spec for."""
    return list(runpy.run_path(str(_checkout() / INVENTORY))["SPECS"])


def provision(twin: Any, dry: bool, with_driver: bool = True) -> int:
    """Give ``twin`` (a twin.node.Twin) its driver and guests unless it has them, then run the
    main deploy on it alone, with the spec of its profile, and the guest deploy on its
    containers."""
    from gpuhost.spec.inventory import load_inventory
    from twin import demo_guests, driver

    os.environ[TARGET_ENV] = twin.name  # inventory/twin.py then holds this twin only
    spec, _ = load_inventory(_checkout() / INVENTORY)[twin.name]
    version = spec.driver.version
    # driver.install's own test of an earlier install: say what it does first, it takes a while
    if with_driver and not (twin.root / f"lib/firmware/nvidia/{version}").is_dir():
        say(f"{twin.name}: installing a simulated NVIDIA driver {version}, then rebooting it")
        t0 = time.monotonic()
        driver.install(twin, version)
        say(f"{twin.name}: driver installed in {time.monotonic() - t0:.0f} s")
    # kpro6 had its guests before gpuhost ran; so has its twin (made so even for --dry, like the
    # driver above: they are the twin's starting state, not the deploy's changes)
    guests = [g.model_dump(mode="json") for g in spec.guests]
    created = demo_guests.ensure(twin, guests, version if with_driver else None)
    if created:
        say(f"{twin.name}: its spec's guests and a local CUDA mirror, made as on a real node:")
        for command in created:
            say(f"  {command}")
    rc = _pyinfra(twin, dry, "deploys/gpu_host.py", twin.name)  # its containers are hosts too
    containers = [g["name"] for g in guests if g["kind"] == "lxc"]
    if rc != 0 or not containers or not with_driver:  # CUDA needs the host's driver
        return rc
    # then the software in its containers (CUDA, environment, venvs), so the audit has it all
    return _pyinfra(twin, dry, "deploys/gpu_guest.py", ",".join(containers))


def _pyinfra(twin: Any, dry: bool, deploy: str, limit: str) -> int:
    pyinfra = Path(sys.executable).parent / "pyinfra"
    # --dry without -y: pyinfra then runs change detection and lists what would change
    command = [str(pyinfra), "--dry" if dry else "-y", INVENTORY, deploy, "--limit", limit]
    say(f"{TARGET_ENV}={twin.name} {' '.join(command)}")
    return subprocess.run(command, cwd=_checkout()).returncode


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _checkout() -> Path:
    import gpuhost

    return Path(gpuhost.__file__).resolve().parents[1]
