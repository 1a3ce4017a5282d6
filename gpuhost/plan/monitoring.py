"""The metrics timer (the spec's monitoring section): the files, units and package it needs.

gpuhost-metrics.timer starts gpuhost-metrics.service every ``interval_seconds``; the service
runs /usr/local/lib/gpuhost/metrics, which runs `gpuhost metrics --local` from the runtime under
/opt/gpuhost/current (gpuhost and pydantic for the host's python3, gpuhost/build/runtime.py)
against /etc/gpuhost/spec.json, writing node_exporter's textfile directory. Debian's
prometheus-node-exporter serves it; a drop-in gives it a listen address or another textfile
directory only where the spec asks for one. With monitoring off every file here is absent.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.observe.monitoring import (
    EXPORTER_PACKAGE,
    EXPORTER_UNIT,
    METRICS_TIMER,
    METRICS_UNIT,
    TIMER_PATH,
)
from gpuhost.paths import CONFIG_DIR, METRICS_SCRIPT, RUNTIME_LINK
from gpuhost.plan.model import ManagedFile
from gpuhost.spec.host import HostSpec
from gpuhost.spec.monitoring import DEBIAN_TEXTFILE_DIR
from gpuhost.spec.specfile import dump_spec

SPEC_FILE = f"{CONFIG_DIR}/spec.json"  # gpuhost/spec/specfile.py: dump_spec, load_spec
UNIT_DIR = "/etc/systemd/system"
SERVICE_FILE = f"{UNIT_DIR}/{METRICS_UNIT}"
TIMER_FILE = TIMER_PATH
TIMER_WANTS = f"{UNIT_DIR}/timers.target.wants/{METRICS_TIMER}"
EXPORTER_DROPIN = f"{UNIT_DIR}/{EXPORTER_UNIT}.d/gpuhost-monitoring.conf"
EXPORTER_BINARY = "/usr/bin/prometheus-node-exporter"  # the Debian unit's ExecStart=
METRICS_NAME = "gpuhost.prom"  # node_exporter reads *.prom files
METRICS_MODULE = "gpuhost.cli"  # `python3 -m` this with `metrics --local ...`
UNITS = (SERVICE_FILE, TIMER_FILE, EXPORTER_DROPIN)  # each change needs systemd's reload
FILES = (SPEC_FILE, METRICS_SCRIPT, SERVICE_FILE, TIMER_FILE, TIMER_WANTS, EXPORTER_DROPIN)


@dataclass(frozen=True)
class MonitoringPlan:
    """What the host runs for the metrics (None on the Plan: monitoring is off)."""

    interval: int  # seconds between runs
    out: str  # the metrics file
    node_exporter: bool  # install Debian's package and keep it running
    exporter_dropin: bool  # node_exporter needs gpuhost's drop-in (listen address, directory)
    python: str | None  # the host's python3 (major.minor) the runtime is for; None: none found
    package: str = EXPORTER_PACKAGE


def metrics_script(host: str, out: str) -> str:
    q = shlex.quote
    return (
        "#!/bin/sh\n"
        "# gpuhost: the audit's host and guest checks as Prometheus text, for node_exporter's\n"
        "# textfile collector. gpuhost-metrics.service runs it; the deploy writes it from the\n"
        "# spec's monitoring section. OUT= is read back by the deploy and the audit.\n"
        f"OUT={q(out)}\n"
        f"SPEC={q(SPEC_FILE)}\n"
        f"HOST={q(host)}\n"
        f"PYTHONPATH={q(RUNTIME_LINK + '/site')}\n"
        "export PYTHONPATH\n"
        "cd / || exit 1\n"
        f'exec /usr/bin/python3 -s -m {METRICS_MODULE} metrics --local --spec "$SPEC" '
        '--host-name "$HOST" --out "$OUT"\n'
    )


def service_unit(interval: int) -> str:
    return (
        "[Unit]\n"
        "Description=gpuhost: the audit's checks as Prometheus metrics (textfile collector)\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"ExecStart={METRICS_SCRIPT}\n"
        "# A background job: it must never slow the guests down.\n"
        "Nice=19\n"
        "IOSchedulingClass=idle\n"
        f"TimeoutStartSec={interval}\n"
    )


def timer_unit(interval: int) -> str:
    return (
        "[Unit]\n"
        "Description=gpuhost: run the audit's checks as metrics every "
        f"{interval} seconds\n"
        "\n"
        "[Timer]\n"
        "OnBootSec=2min\n"
        f"OnUnitActiveSec={interval}s\n"
        "# a boot or a stop in between runs the missed run at once\n"
        "Persistent=true\n"
        "AccuracySec=10s\n"
        "\n"
        "[Install]\n"
        "WantedBy=timers.target\n"
    )


def exporter_dropin(listen: str | None, textfile_dir: str) -> str:
    """Debian's unit runs `prometheus-node-exporter $ARGS` (ARGS from
    /etc/default/prometheus-node-exporter): the drop-in keeps ARGS and adds gpuhost's flags."""
    flags = []
    if listen is not None:
        flags.append(f"--web.listen-address={listen}")
    if textfile_dir != DEBIAN_TEXTFILE_DIR:
        flags.append(f"--collector.textfile.directory={textfile_dir}")
    return (
        "# gpuhost: node_exporter as the spec's monitoring section asks (ARGS kept)\n"
        "[Service]\n"
        "ExecStart=\n"
        f"ExecStart={EXPORTER_BINARY} $ARGS {' '.join(flags)}\n"
    )


def plan_monitoring(
    host: str, spec: HostSpec, facts: HostFacts
) -> tuple[MonitoringPlan | None, dict[str, ManagedFile]]:
    """The timer's plan and its files (all absent with monitoring off)."""
    mon = spec.monitoring
    wanted: dict[str, str | None] = dict.fromkeys(FILES)
    links: dict[str, str] = {}
    plan = None
    if mon.enabled:
        out = f"{mon.textfile_dir}/{METRICS_NAME}"
        dropin = mon.node_exporter and (
            mon.listen_address is not None or mon.textfile_dir != DEBIAN_TEXTFILE_DIR
        )
        state = facts.monitoring
        plan = MonitoringPlan(
            interval=mon.interval_seconds,
            out=out,
            node_exporter=mon.node_exporter,
            exporter_dropin=dropin,
            python=state.python if state is not None else None,
        )
        wanted[SPEC_FILE] = dump_spec(spec)  # secret-named env values redacted
        wanted[METRICS_SCRIPT] = metrics_script(host, out)
        wanted[SERVICE_FILE] = service_unit(mon.interval_seconds)
        wanted[TIMER_FILE] = timer_unit(mon.interval_seconds)
        links[TIMER_WANTS] = TIMER_FILE
        if dropin:
            wanted[EXPORTER_DROPIN] = exporter_dropin(mon.listen_address, mon.textfile_dir)
    files = {}
    for path in FILES:
        mode = "755" if path == METRICS_SCRIPT else "600" if path == SPEC_FILE else "644"
        if path == TIMER_WANTS:
            files[path] = ManagedFile(path, None, "monitoring", link=links.get(path))
        else:
            files[path] = ManagedFile(path, wanted[path], "monitoring", mode=mode)
    return plan, files
