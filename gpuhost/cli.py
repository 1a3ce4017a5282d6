"""`gpuhost` command: show the plan for an inventory, capture host facts for offline planning.

gpuhost plan inventory/kpro6.py                      # facts from the live host (SSH)
gpuhost plan inventory/kpro6.py --facts DIR          # facts from a saved snapshot
gpuhost capture inventory/kpro6.py --out DIR         # save a snapshot of the live host
gpuhost capture-script > capture.sh                  # the same, as a script to run anywhere
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from pyinfra.api.exceptions import PyinfraError

from gpuhost.hostfacts import (
    capture_script,
    gather_live,
    parse_raw,
    read_snapshot,
    write_snapshot,
)
from gpuhost.inventory import load_inventory
from gpuhost.plan import make_plan
from gpuhost.render import render_plan


def _plan(args: argparse.Namespace) -> int:
    hosts = load_inventory(args.inventory)
    if args.host:
        if args.host not in hosts:
            raise PyinfraError(
                f"{args.inventory}: no host {args.host!r} (hosts: {', '.join(hosts)})"
            )
        hosts = {args.host: hosts[args.host]}
    if args.facts:
        if len(hosts) > 1:
            raise PyinfraError("--facts holds one host's snapshot; choose the host with --host")
        raws = {name: read_snapshot(args.facts) for name in hosts}
    else:
        raws = gather_live(args.inventory, args.host)
    for name, (spec, _) in hosts.items():
        print(render_plan(make_plan(name, spec, parse_raw(raws[name]))))
    return 0


def _capture(args: argparse.Namespace) -> int:
    raws = gather_live(args.inventory, args.host)
    for name, raw in raws.items():
        out = Path(args.out) / name if len(raws) > 1 else Path(args.out)
        write_snapshot(out, raw)
        print(f"{name}: snapshot written to {out}")
    return 0


def _twin(args: argparse.Namespace) -> int:
    """Start a local twin if none runs, then provision it with the main deploy."""
    import os

    from twin import driver, node

    if os.geteuid() != 0:
        raise PyinfraError("twins need root (overlay mounts, chroot sshd): run with sudo")
    running = [t for t in node.list_twins() if node.is_up(t)]
    if not running:
        print(f"starting a {args.profile} twin...", file=sys.stderr)
        running = node.start_fleet(1, args.profile)
    twin = running[0]
    spec, _ = load_inventory(INVENTORY)[twin.name]
    if args.driver and driver.install(twin, spec.driver.version):
        print(
            f"{twin.name}: simulated NVIDIA driver {spec.driver.version} installed", file=sys.stderr
        )
    pyinfra = Path(sys.executable).parent / "pyinfra"
    # --dry without -y: pyinfra then runs change detection and lists what would change
    command = [str(pyinfra), "--dry" if args.dry else "-y", INVENTORY, "deploys/gpu_host.py"]
    print(" ".join(command), file=sys.stderr)
    return subprocess.run(command, cwd=Path(__file__).parents[1]).returncode


INVENTORY = "inventory/twin.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuhost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="print the GPU plan for an inventory")
    plan.add_argument("inventory")
    plan.add_argument("--host", help="only this host of the inventory")
    plan.add_argument("--facts", help="a snapshot directory instead of the live host")
    plan.set_defaults(run=_plan)
    capture = sub.add_parser("capture", help="save a snapshot of a live host's facts")
    capture.add_argument("inventory", help="inventory file, or a pyinfra host such as @local")
    capture.add_argument("--host", help="only this host of the inventory")
    capture.add_argument("--out", required=True)
    capture.set_defaults(run=_capture)
    script = sub.add_parser("capture-script", help="print a shell script that saves a snapshot")
    script.set_defaults(run=lambda _: print(capture_script(), end="") or 0)
    twin = sub.add_parser("twin", help="provision a local simulated host (starts one if needed)")
    twin.add_argument("--profile", default="kpro6", help="hardware profile of a new twin")
    twin.add_argument("--dry", action="store_true", help="show the plan and changes only")
    twin.add_argument(
        "--no-driver",
        dest="driver",
        action="store_false",
        help="leave the twin without an NVIDIA driver (default: simulate the spec's driver)",
    )
    twin.set_defaults(run=_twin)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (PyinfraError, ValueError, FileNotFoundError) as exc:
        print(f"gpuhost: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
