"""The spec's monitoring section: the audit as Prometheus metrics, written on the host by a
systemd timer into node_exporter's textfile directory, and Debian's node_exporter to serve them.
Kept apart from gpuhost/spec/host.py so each module stays small."""

from __future__ import annotations

import ipaddress
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gpuhost.redact import show
from gpuhost.spec.grammar import DNS_NAME_RE, LISTEN_RE
from gpuhost.spec.values import AbsPath

# Debian's prometheus-node-exporter reads *.prom files here: its --collector.textfile.directory
# default is patched to this path, and the textfile collector is on by default (`--help` of
# 1.5.0-1+b6 in bookworm; README.textfile in its docs names the same directory).
DEBIAN_TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"


def _listen(value: str) -> str:
    """host:port, [v6]:port or :port (every address), as node_exporter's --web.listen-address."""
    fix = "write host:port, e.g. '127.0.0.1:9100', '[::1]:9100' or ':9100' (every address)"
    match = LISTEN_RE.fullmatch(value) if len(value) <= 260 else None
    if match is None:
        raise ValueError(f"{show(value)} is not a listen address; {fix}")
    host, port = match["host"], int(match["port"])
    if not 1 <= port <= 65535:
        raise ValueError(f"{show(value)}: port {port} is out of range (1-65535); {fix}")
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{show(value)}: {host} is not an IPv6 address; {fix}") from None
    elif host and not DNS_NAME_RE.fullmatch(host):
        raise ValueError(f"{show(value)}: {show(host)} is not a host name or address; {fix}")
    return value


ListenAddress = Annotated[str, AfterValidator(_listen)]


class MonitoringSpec(BaseModel):
    """The audit as metrics: a timer on the host writes Prometheus text for node_exporter."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    enabled: bool = Field(
        False,
        description="Install the timer (gpuhost-metrics.timer) that runs the audit's host and "
        "guest checks on the host itself and writes their results as Prometheus text into "
        "`textfile_dir`, with the runtime it needs (gpuhost, pydantic and jinja2 for the "
        "host's python3, under /opt/gpuhost), and Debian's prometheus-node-exporter to serve them.",
    )
    interval_seconds: int = Field(
        300,
        ge=30,
        le=86400,
        description="Seconds between two runs of the checks (the timer's OnUnitActiveSec=); a "
        "run may take at most this long. The audit's `monitoring.fresh` check fails once the "
        "metrics file is older than twice this plus a minute.",
    )
    textfile_dir: AbsPath = Field(
        DEBIAN_TEXTFILE_DIR,
        description="The directory node_exporter's textfile collector reads; the metrics go to "
        "`gpuhost.prom` there. Debian's default is kept as it is; another directory is "
        "given to node_exporter by a systemd drop-in (--collector.textfile.directory).",
    )
    node_exporter: bool = Field(
        True,
        description="Install Debian's prometheus-node-exporter (apt) and keep it running. "
        "false: only the metrics file is written (another agent reads `textfile_dir`).",
    )
    listen_address: ListenAddress | None = Field(
        None,
        description="node_exporter's --web.listen-address, e.g. '127.0.0.1:9100' (loopback "
        "only, for a local agent or an SSH tunnel). None: the package's own setting (Debian: "
        "':9100', every address, unless ARGS in /etc/default/prometheus-node-exporter says "
        "otherwise). Set, a systemd drop-in adds it to node_exporter's command line after ARGS "
        "(keep ARGS free of --web.listen-address, which repeats rather than replaces).",
    )
