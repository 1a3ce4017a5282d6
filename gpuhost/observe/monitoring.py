"""What the metrics timer needs and shows on a host, read in one command: the host's python3
(the runtime is built for its version), the runtime in use, Debian's node_exporter, the timer,
and the age of the metrics file the timer writes."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe
from gpuhost.paths import METRICS_SCRIPT, RUNTIME_LINK

EXPORTER_PACKAGE = "prometheus-node-exporter"
EXPORTER_UNIT = "prometheus-node-exporter.service"
METRICS_UNIT = "gpuhost-metrics.service"
METRICS_TIMER = "gpuhost-metrics.timer"
TIMER_PATH = f"/etc/systemd/system/{METRICS_TIMER}"
_KEYS = (
    "python",
    "runtime",
    "runtime_age",
    "exporter",
    "exporter_active",
    "timer_active",
    "metrics_age",
)


@dataclass(frozen=True)
class MonitoringState:
    python: str | None = None  # "3.11" (major.minor of python3); None: no python3
    runtime: str | None = None  # the runtime link's target; None: no runtime
    exporter: str | None = None  # prometheus-node-exporter's version; None: not installed
    exporter_active: bool = False
    timer_active: bool = False
    metrics_age: int | None = None  # seconds since the metrics file was written; None: no file
    runtime_age: int | None = None  # seconds since the runtime link was switched; None: no link


def parse_monitoring(lines: list[str]) -> MonitoringState:
    values: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if not sep or key not in _KEYS:
            raise UnparsedOutput("monitoring state", line)
        values[key] = value.strip()
    python = re.fullmatch(r"Python (3\.[0-9]+)\.[0-9]+\S*", values.get("python", ""))
    exporter = values.get("exporter", "").split()
    ages: dict[str, int | None] = {}
    for key in ("metrics_age", "runtime_age"):
        age = values.get(key, "")
        if age and not re.fullmatch(r"-?[0-9]+", age):
            raise UnparsedOutput("monitoring state", f"{key}={age}")
        ages[key] = max(int(age), 0) if age else None  # a clock step back reads as 0
    return MonitoringState(
        python=python[1] if python else None,
        runtime=values.get("runtime") or None,
        # dpkg's "ii" (installed, no error): half-installed or removed packages do not count
        exporter=exporter[1] if len(exporter) == 2 and exporter[0] == "ii" else None,
        exporter_active=values.get("exporter_active") == "active",
        timer_active=values.get("timer_active") == "active",
        metrics_age=ages["metrics_age"],
        runtime_age=ages["runtime_age"],
    )


class MonitoringStateFact(Probe[MonitoringState]):
    """
    Returns the host's :class:`MonitoringState`: python3's version, the metrics runtime link
    (/opt/gpuhost/current) and its age (the link's own mtime: the install switched it then),
    prometheus-node-exporter's package and service, the metrics timer,
    and the age in seconds of the file the timer writes (its path is the OUT= line of the
    script the timer runs).
    """

    default = MonitoringState

    def command(self) -> str:
        # systemctl only where there is a unit to ask about: most hosts have neither
        return (
            'echo "python=$(python3 -V 2>/dev/null)"; '
            f'echo "runtime=$(readlink {RUNTIME_LINK} 2>/dev/null)"; '
            f"if [ -L {RUNTIME_LINK} ]; then "
            f'echo "runtime_age=$(( $(date +%s) - $(stat -c %Y {RUNTIME_LINK}) ))"; fi; '
            "echo \"exporter=$(dpkg-query -W -f '${db:Status-Abbrev} ${Version}' "
            f'{EXPORTER_PACKAGE} 2>/dev/null)"; '
            f"if command -v {EXPORTER_PACKAGE} >/dev/null; then "
            f'echo "exporter_active=$(systemctl is-active {EXPORTER_UNIT} 2>/dev/null)"; fi; '
            f"if [ -e {TIMER_PATH} ]; then "
            f'echo "timer_active=$(systemctl is-active {METRICS_TIMER} 2>/dev/null)"; fi; '
            f"out=$(sed -n 's/^OUT=//p' {METRICS_SCRIPT} 2>/dev/null); "
            'if [ -n "$out" ] && [ -f "$out" ]; then '
            'echo "metrics_age=$(( $(date +%s) - $(stat -c %Y "$out") ))"; fi; true'
        )

    def process(self, output: list[str]) -> MonitoringState:
        return parse_monitoring(output)
