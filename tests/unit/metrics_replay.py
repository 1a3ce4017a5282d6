"""The real 1x H200 machine's recorded output, answered to the commands `gpuhost metrics` sends:
the audit's host command (tests/fixtures/captures/h200x1-audit-run) and the telemetry query
(tests/fixtures/captures/h200x1-telemetry)."""

from __future__ import annotations

import csv
from pathlib import Path

from gpuhost.audit.observe import CHANGED_SINCE_CAPTURES, READ_SINCE_CAPTURES, host_command
from gpuhost.observe.cuda import DEFAULT_SIZES
from gpuhost.observe.parse import STATUS_MARK
from gpuhost.observe.telemetry import TELEMETRY_FIELDS, NvidiaTelemetry

CAPTURES = Path(__file__).parents[1] / "fixtures/captures"
AUDIT_RUN = CAPTURES / "h200x1-audit-run"
TELEMETRY = CAPTURES / "h200x1-telemetry"


def captured_fields() -> tuple[str, ...]:
    return tuple((TELEMETRY / "fields").read_text().strip().split(","))


def telemetry_output() -> str:
    """The captured query's rows with exactly TELEMETRY_FIELDS' columns, by name (the capture
    queried one field more, clocks_throttle_reasons.active, which gpuhost leaves out)."""
    names = captured_fields()
    rows = list(csv.reader((TELEMETRY / "query-gpu.csv").read_text().splitlines()))
    picked = [", ".join(row[names.index(f)].strip() for f in TELEMETRY_FIELDS) for row in rows]
    return "".join(line + "\n" for line in picked) + f"{STATUS_MARK}0\n"


def replay(command: str) -> tuple[int, str, str]:
    if command == host_command(DEFAULT_SIZES):
        # less any fact read since the capture (READ_SINCE_CAPTURES), as test_audit_replay does
        captured = host_command(DEFAULT_SIZES, READ_SINCE_CAPTURES, CHANGED_SINCE_CAPTURES)
        assert captured == (AUDIT_RUN / "audit-host.cmd").read_text().rstrip("\n")
        return 0, (AUDIT_RUN / "audit-host.out").read_text(), ""
    if command == NvidiaTelemetry().command():
        return 0, telemetry_output(), ""
    raise AssertionError(f"no capture answers {command[:80]!r}")
