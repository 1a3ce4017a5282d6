"""The python3.13 venv's inputs (tests/trixie_python.py): the test venv's own versions, and the
wheel platforms trixie's glibc runs."""

from __future__ import annotations

import re
import tomllib

from tests.trixie_python import ROOT, UNPINNED, pins, pip_platforms


def test_the_pins_hold_every_exact_pin_of_the_pyproject_files() -> None:
    pinned = dict(line.split("==") for line in pins().splitlines())
    assert not UNPINNED & set(pinned)
    for path in ("pyproject.toml", "gpuhost-twin/pyproject.toml"):
        project = tomllib.loads((ROOT / path).read_text())["project"]
        wanted = [
            *project["dependencies"],
            *project.get("optional-dependencies", {}).get("dev", []),
        ]
        for req in wanted:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", req)
            if m:
                assert pinned[m.group(1).lower().replace("_", "-")] == m.group(2), req


def test_the_platforms_are_those_the_glibc_runs() -> None:
    tags = pip_platforms("2.41")
    assert tags[0] == "manylinux_2_41_x86_64" and "manylinux_2_42_x86_64" not in tags
    assert {"manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"} <= set(tags)
    assert tags[-1] == "manylinux1_x86_64"  # = manylinux_2_5
