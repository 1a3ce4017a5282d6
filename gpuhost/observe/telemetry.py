"""Per-GPU telemetry from ``nvidia-smi --query-gpu`` for the metrics (issue 24): temperatures,
power, memory, utilisation, persistence, ECC errors, retired pages and remapped rows.

Only fields proven on a real machine are queried: each is in the capture
tests/fixtures/captures/h200x1-telemetry (driver 580.159.04, `fields` there). Left out of that
capture's list: ``clocks_throttle_reasons.active``, a bitmask under a deprecated name (the
driver's header already calls it ``clocks_event_reasons.active``). A value nvidia-smi cannot give
reads ``[N/A]`` or ``[Not Supported]`` (the H200 has no retired pages: Hopper repairs memory by
row remapping); such a value is left out, never read as 0.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field

from gpuhost.observe.parse import UnparsedOutput, normalize_bdf, split_status, with_status
from gpuhost.observe.probe import Probe

TELEMETRY_FIELDS = (
    "index",
    "pci.bus_id",
    "uuid",
    "name",
    "temperature.gpu",
    "temperature.memory",
    "power.draw",
    "power.limit",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "persistence_mode",
    "ecc.mode.current",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
    "retired_pages.pending",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "driver_version",
    "vbios_version",
)
# Text fields, kept as they are; every other field is a number or a flag.
TEXT_FIELDS = frozenset({"index", "pci.bus_id", "uuid", "name", "driver_version", "vbios_version"})
# Flags as nvidia-smi prints them (persistence and ECC mode; the pending/failure flags).
FLAGS = {"Enabled": 1.0, "Disabled": 0.0, "Yes": 1.0, "No": 0.0}
UNAVAILABLE = frozenset({"[N/A]", "[Not Supported]", "N/A", "[Unknown Error]"})


@dataclass(frozen=True)
class GpuTelemetry:
    bdf: str  # sysfs form, 0000:00:06.0
    text: dict[str, str]  # index, uuid, name, driver_version, vbios_version
    values: dict[str, float] = field(default_factory=dict)  # field -> value; unavailable: absent


@dataclass(frozen=True)
class Telemetry:
    gpus: list[GpuTelemetry] = field(default_factory=list)
    error: str | None = None  # nvidia-smi's own words when it could not answer


def _value(name: str, cell: str, line: str) -> float:
    if cell in FLAGS:
        return FLAGS[cell]
    try:
        return float(int(cell, 16)) if cell.startswith("0x") else float(cell)  # bitmasks: hex
    except ValueError:
        raise UnparsedOutput(
            "nvidia-smi --query-gpu (telemetry)", line, f"{name}={cell!r}"
        ) from None


def parse_telemetry(lines: list[str], fields: tuple[str, ...] = TELEMETRY_FIELDS) -> Telemetry:
    """The output of ``--format=csv,noheader,nounits`` for ``fields``, with its exit status line."""
    lines, status = split_status(lines, "nvidia-smi --query-gpu (telemetry)")
    if status != 0:
        return Telemetry(
            error=" ".join(line.strip() for line in lines if line.strip()) or f"exit {status}"
        )
    gpus = []
    for line in lines:
        if not line.strip():
            continue
        row = next(csv.reader([line], skipinitialspace=True))
        if len(row) != len(fields):
            raise UnparsedOutput(
                "nvidia-smi --query-gpu (telemetry)",
                line,
                f"{len(row)} cells for {len(fields)} fields",
            )
        cells = dict(zip(fields, (c.strip() for c in row), strict=True))
        text = {k: v for k, v in cells.items() if k in TEXT_FIELDS and k != "pci.bus_id"}
        values = {
            k: _value(k, v, line)
            for k, v in cells.items()
            if k not in TEXT_FIELDS and v not in UNAVAILABLE
        }
        try:
            bdf = normalize_bdf(cells["pci.bus_id"])
        except ValueError as exc:
            raise UnparsedOutput("nvidia-smi --query-gpu (telemetry)", line, str(exc)) from None
        gpus.append(GpuTelemetry(bdf, text, values))
    return Telemetry(gpus=gpus)


class NvidiaTelemetry(Probe[Telemetry]):
    """
    Returns per-GPU telemetry (temperature, power, memory, utilisation, persistence, ECC errors,
    retired pages, remapped rows) keyed by field name; unavailable values are absent.
    """

    requires_command = "nvidia-smi"

    @staticmethod
    def default() -> Telemetry:
        return Telemetry(error="nvidia-smi is not installed")

    def command(self) -> str:
        query = ",".join(TELEMETRY_FIELDS)
        return with_status(f"nvidia-smi --query-gpu={query} --format=csv,noheader,nounits")

    def process(self, output: list[str]) -> Telemetry:
        return parse_telemetry(output)
