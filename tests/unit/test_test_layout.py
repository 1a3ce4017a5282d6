"""pytest collects tests/unit, twin, e2e and build as rootdir-relative modules without packages,
so two test files with one basename cannot both be collected: the whole run stops at collection."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_has_its_own_basename():
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [name for name, n in names.items() if n > 1]
