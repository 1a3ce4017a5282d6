"""Snapshots and the facts registered for the planner."""

import shutil
from pathlib import Path

import pytest

from gpuhost.observe.hostfacts import ADDED_LATER, FACTS, parse_raw, read_snapshot
from tests.unit.conftest import FIXTURES, snapshot


def test_new_facts_from_the_real_capture() -> None:
    facts = parse_raw(snapshot("h200x1"))
    assert not facts.sev.snp_host and not facts.iommu.active


def test_snapshot_from_before_the_new_facts_still_loads(tmp_path: Path) -> None:
    # h200x2 was captured before SevSnp / IommuDomains existed
    assert all(key in FACTS for key in ADDED_LATER)
    raw = snapshot("h200x2")
    assert not ADDED_LATER & set(raw)
    facts = parse_raw(raw)
    assert facts.sev.cpu_flags == frozenset() and facts.iommu.group_types == {}
    # any other missing key is still an error
    copy = tmp_path / "snap"
    shutil.copytree(FIXTURES / "captures" / "h200x2" / "facts", copy)
    (copy / "CpuVendor.rc").unlink()
    with pytest.raises(FileNotFoundError, match="CpuVendor"):
        read_snapshot(copy)


def test_the_one_round_trip_is_logged_by_its_fact_keys_not_its_commands() -> None:
    # pyinfra writes a fact's arguments into "Connected (to load fact ...)" with this function
    from pyinfra.api.util import get_kwargs_str

    from gpuhost.observe.hostfacts import combined_args

    line = get_kwargs_str(combined_args())
    assert line == (
        f"commands={len(FACTS)} facts: PciDevices, IommuGroups, NvidiaGpus "
        f"and {len(FACTS) - 3} more"
    )
    assert get_kwargs_str(combined_args(("BootId",))) == "commands=1 facts: BootId"
