"""`gpuhost metrics`: audit hosts and write their metrics, in Prometheus text format, atomically.

    gpuhost metrics --local --spec /etc/gpuhost/spec.json --host-name kpro6 --out FILE
    gpuhost metrics inventory/kpro6.py [--host kpro6] [--out FILE]

The first runs on the host itself (the timer the deploy installs): its commands run here, its
containers are read through ``pct exec``. The second reads hosts over SSH as `gpuhost audit` does.
Exit 0 when metrics were written, failing checks included (they are data); 1 when no host could
be measured (nothing is written then: the last-run timestamp ages, and its alert fires).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from gpuhost.audit.connect import UnknownHostKey, guest_runners, host_runner, local_runner
from gpuhost.metrics.collect import measure, samples
from gpuhost.metrics.render import Sample, render
from gpuhost.observe.cuda import DEFAULT_SIZES
from gpuhost.spec.specfile import load_spec, redacted_guests


def write_atomically(path: str | Path, text: str) -> None:
    """``text`` into ``path`` in one step: a temporary file in the same directory (so the rename
    stays on one file system), flushed to disk, mode 0644, then renamed over ``path``; a reader
    (node_exporter) sees the old file or the new, never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sizes(text: str | None) -> tuple[int, ...]:
    if not text:
        return DEFAULT_SIZES
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"--p2p-sizes {text!r}: give byte counts, comma-separated") from None
    if not sizes or min(sizes) <= 0:
        raise ValueError(f"--p2p-sizes {text!r}: give positive byte counts, comma-separated")
    return sizes


def _local(args: argparse.Namespace) -> tuple[list[Sample], list[str]]:
    if not args.spec or not args.host_name:
        raise ValueError("--local needs --spec FILE (the host's spec JSON) and --host-name NAME")
    spec = load_spec(args.spec)  # a bad spec file: exit 2, naming the field
    sizes = _sizes(args.p2p_sizes)
    try:
        measured = measure(
            args.host_name,
            spec,
            local_runner,
            sizes=sizes,
            source=args.spec,
            redacted=redacted_guests(spec),
        )
    except Exception as exc:  # the host unreadable (no output, a parser's refusal): exit 1
        return [], [f"{args.host_name} could not be measured: {exc}"]
    return samples(args.host_name, measured), []


def _remote(args: argparse.Namespace) -> tuple[list[Sample], list[str]]:
    from gpuhost.spec.inventory import SOURCE_KEY, load_inventory  # the control machine's (pyinfra)

    hosts = load_inventory(args.inventory)
    if args.host:
        if args.host not in hosts:
            raise ValueError(f"{args.inventory}: no host {args.host!r} (hosts: {', '.join(hosts)})")
        hosts = {args.host: hosts[args.host]}
    sizes = _sizes(args.p2p_sizes)
    out: list[Sample] = []
    failed = []
    for name, (spec, data) in hosts.items():
        try:
            measured = measure(
                name,
                spec,
                host_runner(name, data),
                guest_runners(name, data),
                sizes,
                data.get(SOURCE_KEY) or str(args.inventory),
            )
        except UnknownHostKey:
            raise
        except Exception as exc:  # one host unreadable: the others are still measured
            failed.append(f"{name} could not be measured: {exc}")
            continue
        out += samples(name, measured)
    return out, failed


def run_metrics(args: argparse.Namespace) -> int:
    if args.local:
        if args.inventory or args.host:
            raise ValueError(
                "--local audits this machine: give --spec and --host-name, no inventory"
            )
        found, failed = _local(args)
    else:
        if not args.inventory:
            raise ValueError("give an inventory, or --local --spec FILE --host-name NAME")
        if args.spec or args.host_name:
            raise ValueError("--spec and --host-name go with --local (the host itself)")
        found, failed = _remote(args)
    for line in failed:
        print(f"gpuhost metrics: {line}", file=sys.stderr)
    if not found:
        return 1
    text = render(found)
    if args.out:
        write_atomically(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    metrics = sub.add_parser(
        "metrics",
        help="audit hosts and write Prometheus metrics (checks, versions, GPU telemetry)",
    )
    metrics.add_argument("inventory", nargs="?", help="the inventory (not with --local)")
    metrics.add_argument("--host", help="only this host of the inventory")
    metrics.add_argument(
        "--local", action="store_true", help="audit this machine (the host itself) against --spec"
    )
    metrics.add_argument("--spec", metavar="FILE", help="with --local: the host's spec JSON")
    metrics.add_argument("--host-name", help="with --local: the host's name in the inventory")
    metrics.add_argument(
        "--out", metavar="FILE", help="write here atomically (default: standard output)"
    )
    metrics.add_argument("--p2p-sizes", help="P2P copy sizes in bytes, comma-separated")
    metrics.set_defaults(run=run_metrics)
