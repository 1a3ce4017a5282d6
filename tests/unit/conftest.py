"""Helpers for unit tests: real captured output lives in tests/fixtures (see the READMEs there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.hostfacts import HostFacts, parse_raw, read_snapshot

FIXTURES = Path(__file__).parent.parent / "fixtures"
MACHINES = ("h200x1", "h200x2")  # real captures: 1 and 2 NVIDIA H200


def captured(machine: str, key: str) -> list[str]:
    """stdout of fact ``key`` as captured on a real machine."""
    return (FIXTURES / "captures" / machine / "facts" / f"{key}.out").read_text().splitlines()


def proxmox(name: str) -> list[str]:
    return (FIXTURES / "proxmox" / "facts" / name).read_text().splitlines()


def snapshot(machine: str) -> dict[str, tuple[int, list[str]]]:
    return read_snapshot(FIXTURES / "captures" / machine / "facts")


@pytest.fixture(params=MACHINES)
def machine(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def h200x2_facts() -> HostFacts:
    return parse_raw(snapshot("h200x2"))
