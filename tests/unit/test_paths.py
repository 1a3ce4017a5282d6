"""Every path the Plan manages, and every record gpuhost keeps, is one the managed-files fact
reads back (gpuhost/paths.py MANAGED_PATHS): a path outside them would be written on every run
and never compared, nor removed when the plan drops it."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest

from deploys.guests import RECORD as GUEST_RECORD
from deploys.reboot import RECORD as REBOOT_RECORD
from gpuhost.paths import MANAGED_PATHS
from gpuhost.plan.guests.containers import RECORD_PREFIX
from gpuhost.plan.make import Plan, make_plan
from gpuhost.plan.trial.state import RECORD as TRIAL_RECORD
from gpuhost.spec.host import HostSpec
from tests.unit.hosts import kpro6, kpro6_raw

KPRO6 = {"kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "580.95.05"}}


def read_back(path: str) -> bool:
    """As the shell expands the globs: a `*` never crosses a `/`."""
    parts = path.split("/")
    return any(
        len(glob.split("/")) == len(parts)
        and all(fnmatchcase(p, g) for p, g in zip(parts, glob.split("/"), strict=True))
        for glob in MANAGED_PATHS
    )


def _plan(**guests: object) -> Plan:
    raw = kpro6_raw()
    raw["PveGuestConfigs"] = (0, [])  # VM 129's hand-made hostpci entries would give GPUs twice
    spec = HostSpec.model_validate(
        {
            **KPRO6,
            "guests": [
                {"kind": "lxc", "ctid": 200, "name": "ct200", "gpus": [0, 1]},
                {"kind": "vm", "vmid": 129, "name": "vm129", "gpus": [7], "machine": "q35"},
            ],
            **guests,
        }
    )
    return make_plan("kpro6", spec, kpro6(**raw))


def test_the_glob_reading_is_the_shells() -> None:
    assert read_back("/etc/modprobe.d/gpuhost-nvidia.conf")
    assert not read_back("/etc/modprobe.d/sub/gpuhost-nvidia.conf")
    assert not read_back("/etc/modprobe.d/nvidia.conf")


@pytest.mark.parametrize("modules", [{}, {"uvm_disable_hmm": True, "blacklist_nouveau": True}])
def test_every_planned_file_and_record_is_read_back(modules: dict) -> None:
    plan = _plan(modules=modules)
    paths = [*plan.files, *plan.trial_commit_files, *(f.marker for f in plan.follow_ups)]
    paths += [GUEST_RECORD, REBOOT_RECORD, TRIAL_RECORD, f"{RECORD_PREFIX}200-devices"]
    assert [p for p in paths if not read_back(p)] == []
