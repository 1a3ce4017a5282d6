"""kernel.trial: defaults, ranges and strict types, with errors that name the field."""

import pytest

from gpuhost.spec.host import HostSpec
from gpuhost.spec.validate import SpecError, validate_spec

BASE = {"driver": {"version": "580.159.04"}}


def kernel(**trial: object) -> dict:
    return {**BASE, "kernel": {"version": "6.8.12-9-pve", "trial": trial}}


def test_defaults() -> None:
    trial = HostSpec.model_validate(kernel()).kernel.trial
    assert (trial.panic_timeout, trial.deadline_minutes, trial.without_oneshot) == (10, 20, False)


def test_opt_in_and_values() -> None:
    data = kernel(panic_timeout=30, deadline_minutes=45, without_oneshot=True)
    trial = HostSpec.model_validate(data).kernel.trial
    assert (trial.panic_timeout, trial.deadline_minutes, trial.without_oneshot) == (30, 45, True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("panic_timeout", 0),  # panic=0 waits forever; the initramfs halts
        ("panic_timeout", 301),
        ("panic_timeout", True),  # strict: a bool is not a number of seconds
        ("panic_timeout", "10"),
        ("deadline_minutes", 1),
        ("without_oneshot", "yes"),
        ("watchdog", True),  # unknown keys are refused
    ],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(SpecError) as info:
        validate_spec("inventory/x.py", "kpro6", kernel(**{field: value}))
    assert f"kernel.trial.{field}" in str(info.value)
