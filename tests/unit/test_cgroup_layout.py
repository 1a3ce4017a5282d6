"""Which container device rules take effect: cgroup v1 keys only on the hybrid layout."""

from dataclasses import replace

import pytest

from gpuhost.observe.containers import PackageVersion
from gpuhost.observe.hostfacts import parse_raw, read_snapshot
from tests.unit.conftest import FIXTURES


@pytest.fixture(scope="module")
def kpro6():
    return parse_raw(read_snapshot(FIXTURES.parent.parent / "examples" / "kpro6-facts"))


@pytest.mark.parametrize(
    ("extra", "pve_container", "v1"),
    [
        ([], "5.3.5", False),  # PVE 8's default: pure cgroup2
        (["systemd.unified_cgroup_hierarchy=0"], "5.3.5", True),  # PVE 8 booted hybrid
        (["systemd.unified_cgroup_hierarchy=false"], None, True),
        (["systemd.unified_cgroup_hierarchy=1"], "5.3.5", False),
        (["systemd.unified_cgroup_hierarchy=0"], "6.0.11", False),  # PVE 9 has no hybrid
    ],
)
def test_v1_device_rules_count_only_on_the_hybrid_layout(kpro6, extra, pve_container, v1):
    facts = replace(
        kpro6,
        cmdline=[*kpro6.cmdline, *extra],
        pve_container=PackageVersion(pve_container) if pve_container else None,
    )
    assert facts.cgroup_v1_devices is v1
