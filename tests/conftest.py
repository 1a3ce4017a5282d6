"""Fixtures for every test directory, and the test tiers.

Every test gets exactly one tier marker, from where it lives and which fixtures it uses, never
by hand (a hand-placed marker drifts from what the test really needs):

    vm      tests/vm: real boots of real Debian systems in QEMU (tests/vm/conftest.py)
    build   tests/build, or any test using `built_kernel` (the real kernel build)
    e2e     tests/e2e tests that start a twin (through the fixtures below)
    twin    other tests that start a twin
    unit    everything else: no twin boot, no kernel build; `./gpuhost-test --quick` runs these

A unit-tier test that starts a twin anyway (directly, or through `python -m twin` in a
subprocess) fails, naming the fixtures to take instead: GPUHOST_TWIN_FORBID is set around it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.build.kernel_cache import BuiltKernel, built_kernel_store, missing

TESTS = Path(__file__).parent
# The fixtures that boot twins (gpuhost-twin's pytest plugin, tests/e2e/conftest.py) and build.
TWIN_FIXTURES = frozenset({"twin", "twins", "twin_fleet", "twin_base", "trixie_base", "fresh"})
BUILD_FIXTURES = frozenset({"built_kernel"})


def tier(item: pytest.Item) -> str:
    """The tier of a collected test (see the module docstring)."""
    where = Path(item.path).resolve().relative_to(TESTS.resolve()).parts[0]
    uses = set(getattr(item, "fixturenames", ()))
    if where == "vm":
        return "vm"
    if where == "build" or uses & BUILD_FIXTURES:
        return "build"
    if uses & TWIN_FIXTURES:
        return "e2e" if where == "e2e" else "twin"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(getattr(pytest.mark, tier(item)))
    if hasattr(config, "workerinput"):  # an xdist worker (xdist sets numprocesses None there)
        items.sort(key=run_order)


# The order xdist workers take modules in (./gpuhost-test runs --dist loadscope with
# --no-loadscope-reorder, which keeps it; xdist's default reorder puts the modules with the
# most tests first, so the long few-test e2e modules ran last, one core idle beside them): the
# longest work first, the many short tests last, filling the end. BUILDS_FIRST builds a kernel
# itself (the cache's build on a clean machine, tests/build/killed_build.py; its own over SSH
# on a warm one); the other build-tier tests wait for that kernel, so e2e work overlaps it.
BUILDS_FIRST = "tests/build/test_build_host.py"
RUN_ORDER = ("vm", "e2e", "build", "twin", "unit")
# The vm modules that wait longest (a trial's deadline, a hung task, a kernel build's trial)
# go first, so their waits overlap the others' work (seconds in CI, Dec 2026: 390-500 each).
VM_LONGEST = (
    "test_trial_kernel_hang.py",
    "test_kernel_trial.py",
    "test_trial_bios_lvm.py",
    "test_emergency_backstop.py",
    "test_trial_passphrase.py",
    "test_trial_hang.py",
)


def run_order(item: pytest.Item) -> tuple[int, int]:
    if Path(item.path).resolve() == (TESTS.parent / BUILDS_FIRST).resolve():
        return 0, 0
    name = Path(item.path).name
    rank = VM_LONGEST.index(name) if name in VM_LONGEST else len(VM_LONGEST)
    return 1 + RUN_ORDER.index(tier(item)), rank


@pytest.fixture(autouse=True)
def _unit_tier_boots_no_twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    if request.node.get_closest_marker("unit") is not None:
        monkeypatch.setenv(
            "GPUHOST_TWIN_FORBID",
            f"{request.node.nodeid} is a unit-tier test (tests/conftest.py) but starts a twin: "
            f"take one through a fixture ({', '.join(sorted(TWIN_FIXTURES))})",
        )


@pytest.fixture(scope="session")
def run_id(request: pytest.FixtureRequest) -> str:
    """An id of this test run, the same on each of its xdist workers."""
    worker = getattr(request.config, "workerinput", None)
    return worker["testrunuid"] if worker is not None else uuid.uuid4().hex


@pytest.fixture(scope="session")
def built_kernel(run_id: str) -> BuiltKernel:
    """The real test kernel (tests/build/kernel_cache.py): its store, release and compiler text,
    built once per machine (the build that fills the cache is this run's killed remote build,
    tests/build/killed_build.py). Skips, naming what is missing, where it cannot be built."""
    lacking = missing()
    if lacking:
        pytest.skip(f"the real kernel build needs {', '.join(lacking)}")
    return built_kernel_store(run_id)
