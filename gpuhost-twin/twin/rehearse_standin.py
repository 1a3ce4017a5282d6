"""TEMPORARY stand-in for g1's twin/fromcapture.py until r25-convert lands: removed before merge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuhost.observe.hostfacts import parse_raw
from twin.profile import PROFILES_DIR


def profile_from_snapshot(raw: dict, *, name: str, source: str) -> dict[str, Any]:
    facts = parse_raw(raw)
    data = yaml.safe_load((PROFILES_DIR / "kpro6.yaml").read_text())
    data["name"] = name
    data["source"] = source
    data["assumed"] = ["everything: a stand-in made from the kpro6 profile"]
    start: dict[str, Any] = {}
    if facts.driver is not None:
        start["driver"] = {"version": facts.driver.version, "open": facts.driver.open}
    data["start"] = start
    return data


def write_profile(data: dict[str, Any], path: Path) -> None:
    Path(path).write_text(
        f"# made from {data.get('source')}\n" + yaml.safe_dump(data, sort_keys=False)
    )
