"""Helpers for unit tests: real captured output lives in tests/fixtures (see the READMEs there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.build.driver import BuiltModule, build_modules
from gpuhost.observe.hostfacts import HostFacts, parse_raw, read_snapshot
from tests.unit.buildtools import DRIVER_TREE, HEADERS, missing_module_build

FIXTURES = Path(__file__).parent.parent / "fixtures"
MACHINES = ("h200x1", "h200x2", "h100x1")  # real captures: 1 and 2 NVIDIA H200, 1 H100


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


@pytest.fixture(scope="session")
def driver_built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[BuiltModule]]:
    """One real build of the stand-in tree against this machine's newest Debian headers with
    gcc-12, shared by the tests that check what a build gives (each build costs seconds):
    (the headers, the modules). Tests that test the building itself build on their own."""
    problem = missing_module_build(HEADERS)
    if problem:
        pytest.skip(problem)
    out = tmp_path_factory.mktemp("ko")
    return HEADERS[-1], build_modules(DRIVER_TREE, HEADERS[-1], "gcc-12", 2, out)
