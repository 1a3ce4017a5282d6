"""`gpuhost` command: show the plan for an inventory, capture host facts for offline planning.

gpuhost plan inventory/kpro6.py                      # facts from the live host (SSH)
gpuhost plan inventory/kpro6.py --facts DIR          # facts from a saved snapshot
gpuhost capture inventory/kpro6.py --out DIR         # save a snapshot of the live host
gpuhost capture-script > capture.sh                  # the same, as a script to run anywhere
gpuhost build inventory/kpro6.py [--jobs N]          # build a source kernel into the store
                                                     #   (here, or on artifacts.build_host)
gpuhost metrics inventory/kpro6.py [--out FILE]      # audit as Prometheus metrics
gpuhost metrics --local --spec FILE --host-name NAME # the same, on the host itself
gpuhost rehearse inventory/kpro6.py [--facts DIR]    # the deploy on a twin made from one read
                                                     #   of the host (root; gpuhost-twin)
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

from gpuhost.metrics import command as metricscmd
from gpuhost.observe.hostfacts import capture_script, parse_raw, read_snapshot, write_snapshot
from gpuhost.plan.make import make_plan
from gpuhost.plan.render import render_plan

# The host's metrics runtime (`python3 -m gpuhost.cli metrics --local`, gpuhost/build/runtime.py)
# carries gpuhost and pydantic, not pyinfra: the control machine's commands import it when run.
CONTROL_SIDE = importlib.util.find_spec("pyinfra") is not None


def _plan(args: argparse.Namespace) -> int:
    from pyinfra.api.exceptions import PyinfraError

    from gpuhost.control import read_control
    from gpuhost.observe.live import gather_live
    from gpuhost.spec.inventory import load_inventory

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
        facts = parse_raw(raws[name])
        control = read_control(spec, facts, str(args.inventory))
        plan = make_plan(name, spec, facts, str(args.inventory), control)
        print(render_plan(plan))  # a failed precondition is shown; the deploy refuses it
    return 0


def _capture(args: argparse.Namespace) -> int:
    from gpuhost.observe.live import gather_live

    raws = gather_live(args.inventory, args.host)
    for name, raw in raws.items():
        out = Path(args.out) / name if len(raws) > 1 else Path(args.out)
        write_snapshot(out, raw)
        print(f"{name}: snapshot written to {out}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    """The audit suite (gpuhost.audit.suite) under pytest, driven by the inventory.

    Only gpuhost's own plugin is loaded, named here: it works from a source tree on PYTHONPATH
    (no installed pytest11 entry point), and no other installed plugin is loaded. Autoloading
    them made pytest mark typeguard (pyinfra's, imported already) for assertion rewriting, which
    it then warned about on every audit."""
    import importlib.util
    import os

    import pytest

    suite = importlib.util.find_spec("gpuhost.audit.suite")
    assert suite is not None and suite.origin is not None
    where = str(Path(suite.origin).parent)
    argv = [where, "-p", PLUGIN, f"--inventory={args.inventory}", "-p", "no:cacheprovider"]
    argv += ["-q", "-rfs", f"--rootdir={where}"]
    if args.host:
        argv.append(f"--audit-limit={args.host}")
    if args.json:
        argv.append(f"--audit-json={args.json}")
    if args.junit:
        argv.append(f"--junitxml={args.junit}")
    if args.p2p_sizes:
        argv.append(f"--p2p-sizes={args.p2p_sizes}")
    autoload = os.environ.get(NO_AUTOLOAD)
    os.environ[NO_AUTOLOAD] = "1"  # pytest < 8.4 has no --disable-plugin-autoload
    try:
        return int(pytest.main(argv))
    finally:
        if autoload is None:
            del os.environ[NO_AUTOLOAD]
        else:
            os.environ[NO_AUTOLOAD] = autoload


PLUGIN = "gpuhost.audit.plugin"  # the audit's options, fixtures and reports
NO_AUTOLOAD = "PYTEST_DISABLE_PLUGIN_AUTOLOAD"


# Subcommands that other distributions add: name = "module:function", called with the
# subparsers action; gpuhost-twin adds `twin` this way (gpuhost never imports the simulator).
COMMANDS_GROUP = "gpuhost.commands"
TWIN_MISSING = (
    "`gpuhost twin` and `gpuhost rehearse` need the simulator, gpuhost-twin: from a gpuhost "
    "checkout run pip install -e ./gpuhost-twin -e '.[dev]'"
)
# gpuhost-twin's commands, and what each says when it is not installed
TWIN_COMMANDS = {
    "twin": "provision a local simulated host (needs gpuhost-twin)",
    "rehearse": "rehearse the deploy on a twin made from a read of the host (needs gpuhost-twin)",
}


def _add_plugin_commands(sub: argparse._SubParsersAction) -> None:
    """The `gpuhost.commands` entry points; without gpuhost-twin, `gpuhost twin` and `gpuhost
    rehearse` say how to install it."""
    names = set()
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):  # a stable order
        entry.load()(sub)
        names.add(entry.name)
    for name, help in TWIN_COMMANDS.items():
        if name not in names:
            sub.add_parser(name, help=help).set_defaults(run=_twin_missing)


def _twin_missing(_: argparse.Namespace) -> int:
    print(f"gpuhost: {TWIN_MISSING}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    """The `gpuhost` parser with every subcommand (docs/reference/cli.md is generated from it)."""
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
    audit = sub.add_parser("audit", help="audit hosts and their GPU guests against the inventory")
    audit.add_argument("inventory")
    audit.add_argument("--host", help="only this host of the inventory")
    audit.add_argument("--json", metavar="PATH", help="write the JSON report here")
    audit.add_argument("--junit", metavar="PATH", help="write a JUnit XML report here")
    audit.add_argument("--p2p-sizes", help="P2P copy sizes in bytes, comma-separated")
    audit.set_defaults(run=_audit)
    script = sub.add_parser("capture-script", help="print a shell script that saves a snapshot")
    script.set_defaults(run=lambda _: print(capture_script(), end="") or 0)
    if CONTROL_SIDE:
        from gpuhost.build import command as buildcmd

        buildcmd.add_parser(sub)
    metricscmd.add_parser(sub)
    _add_plugin_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.run is not _twin_missing:  # that one takes any arguments
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.run(args)
    except _reported_errors() as exc:
        print(f"gpuhost: {exc}", file=sys.stderr)
        return 2


def _reported_errors() -> tuple[type[Exception], ...]:
    """The errors main() reports in one line (a bad inventory, a refused build...)."""
    errors: tuple[type[Exception], ...] = (ValueError, FileNotFoundError)
    if CONTROL_SIDE:
        from pyinfra.api.exceptions import PyinfraError

        from gpuhost.build.kernel import KernelBuildError

        errors += (PyinfraError, KernelBuildError)
    return errors


if __name__ == "__main__":
    sys.exit(main())
