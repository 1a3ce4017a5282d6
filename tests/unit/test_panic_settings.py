"""The live panic settings: parsed from a real /proc/sys/kernel read, and audited against the
Plan (a trial boot runs with them on; the commit sets them back)."""

from pathlib import Path

import pytest

from gpuhost.observe.kernel import PanicSettings
from gpuhost.observe.parse import UnparsedOutput

CAPTURE = Path(__file__).parents[1] / "fixtures/captures/panic-sysctls/linux-6.18-dev.out"


def test_the_real_read_parses() -> None:
    values = PanicSettings().process(CAPTURE.read_text().splitlines())
    assert values == {
        "panic": "1",
        "panic_on_oops": "0",
        "softlockup_panic": "0",
        "hardlockup_panic": "0",
        "hung_task_panic": "0",
    }


def test_a_kernel_without_a_detector_leaves_its_file_out_and_junk_is_refused() -> None:
    assert PanicSettings().process(["panic_on_oops:1"]) == {"panic_on_oops": "1"}
    with pytest.raises(UnparsedOutput):
        PanicSettings().process(["panic_on_oops:yes"])
    with pytest.raises(UnparsedOutput):
        PanicSettings().process(["kptr_restrict:1"])
