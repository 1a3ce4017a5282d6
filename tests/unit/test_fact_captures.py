"""The captures are the facts' own output: each was made with the exact command the fact runs."""

from pathlib import Path

import pytest

from gpuhost.observe.hostfacts import ADDED_LATER, FACTS, capture_script, fact_command
from tests.unit.conftest import FIXTURES, MACHINES


@pytest.mark.parametrize("machine", MACHINES)
@pytest.mark.parametrize("key", list(FACTS))
def test_capture_made_with_the_facts_command(machine: str, key: str) -> None:
    path = FIXTURES / "captures" / machine / "facts" / f"{key}.cmd"
    if key in ADDED_LATER and not path.exists():
        pytest.skip(f"{machine} was captured before {key} existed (loads with its default)")
    cmd = path.read_text().rstrip("\n")
    cls, _ = FACTS[key]
    if cmd in cls.earlier_commands:  # an earlier command's capture: its parser still reads it
        out = path.with_suffix(".out").read_text().splitlines()
        assert cls().process(out), f"{key}: {machine}'s capture of the earlier command"
        return
    assert cmd == fact_command(key), f"{key}: command changed; recapture {machine}"


def test_checked_in_capture_script_is_current() -> None:
    script = Path(__file__).parents[2] / "tools" / "capture-facts.sh"
    assert script.read_text() == capture_script(), (
        "run: gpuhost capture-script > tools/capture-facts.sh"
    )
