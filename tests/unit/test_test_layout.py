"""pytest collects tests/unit, twin, e2e and build as rootdir-relative modules without packages,
so two test files with one basename cannot both be collected: the whole run stops at collection."""

import re
from collections import Counter
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_has_its_own_basename():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [name for name, n in names.items() if n > 1]


def test_no_test_places_a_tier_marker_by_hand():
    """Tiers come from tests/conftest.py (directory and fixtures); a hand-placed one drifts."""
    marked = [
        p.relative_to(TESTS)
        for p in TESTS.rglob("*.py")
        if re.search(r"pytest\.mark\.(unit|twin|e2e|build)\b", p.read_text())
    ]
    assert marked == []


def test_a_unit_tier_test_cannot_start_a_twin(request):
    from twin import lifecycle, rootfs

    assert request.node.get_closest_marker("unit") is not None
    for start in (rootfs.ensure_base, lifecycle.check_machine):
        with pytest.raises(rootfs.RootfsError, match=re.escape(request.node.nodeid)):
            start()


def test_workers_take_modules_in_the_conftest_order(request):
    """./gpuhost-test keeps tests/conftest.py's run_order (xdist's reorder would put the modules
    with most tests first, the long few-test e2e modules last), whose first module and longest
    vm modules exist."""
    from tests.conftest import BUILDS_FIRST, RUN_ORDER, VM_LONGEST, run_order

    script = (TESTS.parent / "gpuhost-test").read_text()
    assert "--dist loadscope --no-loadscope-reorder" in script
    assert (TESTS.parent / BUILDS_FIRST).is_file()
    assert all((TESTS / "vm" / name).is_file() for name in VM_LONGEST)
    assert run_order(request.node) == (1 + RUN_ORDER.index("unit"), len(VM_LONGEST))
