"""`gpuhost` command: show the plan for an inventory, capture host facts for offline planning.

gpuhost plan inventory/kpro6.py                      # facts from the live host (SSH)
gpuhost plan inventory/kpro6.py --facts DIR          # facts from a saved snapshot
gpuhost capture inventory/kpro6.py --out DIR         # save a snapshot of the live host
gpuhost capture-script > capture.sh                  # the same, as a script to run anywhere
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyinfra.api.exceptions import PyinfraError

from facts.snapshot import Combined
from gpuhost.hostfacts import (
    capture_script,
    combined_args,
    parse_raw,
    read_snapshot,
    write_snapshot,
)
from gpuhost.inventory import SPEC_KEY, load_inventory
from gpuhost.plan import make_plan
from gpuhost.render import render_plan


def gather_live(
    inventory: str, limit: str | None = None
) -> dict[str, dict[str, tuple[int, list[str]]]]:
    """Run every fact command on the inventory's hosts over pyinfra; host -> raw outputs."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.connect import connect_all, disconnect_all

    # Built here rather than with pyinfra_cli, which monkey-patches the whole process (gevent).
    if Path(inventory).is_file():
        hosts = [
            (name, {**data, SPEC_KEY: spec})
            for name, (spec, data) in load_inventory(inventory).items()
        ]
    else:
        hosts = [(name, {}) for name in inventory.split(",")]
    state = State(Inventory((hosts, {})), Config())
    connect_all(state)
    try:
        raw: dict[str, dict[str, tuple[int, list[str]]]] = {}
        for host in state.inventory.iter_activated_hosts():
            if limit and host.name != limit:
                continue
            if host not in state.activated_hosts:
                raise PyinfraError(f"could not connect to {host.name}")
            raw[host.name] = host.get_fact(Combined, **combined_args())
        return raw
    finally:
        disconnect_all(state)


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
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (PyinfraError, ValueError, FileNotFoundError) as exc:
        print(f"gpuhost: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
