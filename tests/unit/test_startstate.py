"""twin/startstate.py without a twin: what a start section the twin cannot set says, and where
captured paths go."""

from __future__ import annotations

from pathlib import Path

import pytest

from twin import startstate
from twin.errors import TwinError
from twin.profile import load_profile


def test_a_running_kernel_the_profile_lacks_is_named(tmp_path: Path) -> None:
    profile = load_profile("h200x2").model_copy(
        update={"start": startstate.HostStart(running_kernel="6.18.44-fc-v973-gpu")}
    )
    with pytest.raises(TwinError, match=r"start.running_kernel='6.18.44-fc-v973-gpu' is not in"):
        startstate.install(tmp_path, profile)
    assert not any(tmp_path.iterdir())  # nothing written before the check


def test_where_captured_paths_go() -> None:
    assert startstate._where("/etc/pve/nodes/kpro6/config", "kpro6", "twin3") == (
        "/etc/pve/nodes/twin3/config"
    )
    assert startstate._where("/etc/hostname", "kpro6", "twin3") is None
    assert startstate._where("/etc/kernel/cmdline", "kpro6", "twin3") == "/etc/kernel/cmdline"
