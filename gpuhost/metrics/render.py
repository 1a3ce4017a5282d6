"""Samples -> the Prometheus text exposition format (version 0.0.4): one HELP and TYPE per
family, a family's samples together, families and samples in a stable order, label values
escaped (backslash, double quote, line feed) as the format requires."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuhost.metrics.families import FAMILIES


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def sample(name: str, value: float, /, **labels: str) -> Sample:
    """A sample of the registered family ``name``, with exactly its labels."""
    family = FAMILIES.get(name)
    if family is None:
        raise ValueError(f"{name} is not a registered metric family (gpuhost/metrics/families.py)")
    if set(labels) != set(family.labels):
        raise ValueError(f"{name} takes labels {family.labels}, not {tuple(labels)}")
    return Sample(name, tuple((k, str(labels[k])) for k in family.labels), float(value))


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def render(samples: list[Sample]) -> str:
    """The exposition text; a sample repeated (same name and labels) is an error, not a guess."""
    by_family: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for s in samples:
        series = by_family.setdefault(s.name, {})
        if s.labels in series:
            raise ValueError(f"{s.name}{dict(s.labels)} written twice")
        series[s.labels] = s.value
    lines = []
    for name in sorted(by_family):
        family = FAMILIES[name]
        lines.append(f"# HELP {name} {escape_help(family.help)}")
        lines.append(f"# TYPE {name} {family.type}")
        for labels, value in sorted(by_family[name].items()):
            text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
            lines.append(f"{name}{{{text}}} {format_value(value)}")
    return "".join(line + "\n" for line in lines)
