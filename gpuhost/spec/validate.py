"""A host's spec validated, and the errors an inventory file raises: every problem at once,
naming the inventory file, the host, the field, the bad value and what would be valid."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pyinfra.api.exceptions import InventoryError

from gpuhost.redact import show
from gpuhost.spec.errors import describe
from gpuhost.spec.host import HostSpec

MAX_PROBLEMS = 25


class SpecError(InventoryError, ValueError):
    """One or more problems in a host's spec."""

    def __init__(self, source: str, host: str, problems: list[str]) -> None:
        self.source, self.host, self.problems = source, host, _capped(problems)
        self.all_problems = problems
        lines = [f"{source}: host {show(host)}: invalid gpuhost spec ({len(problems)} problem(s))"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class InventoryFileError(InventoryError, ValueError):
    """A gpuhost inventory file that declares hosts wrongly (no spec, twice)."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source, self.problems = source, _capped(problems)
        lines = [f"{source}: invalid gpuhost inventory ({len(problems)} problem(s))"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


def _capped(problems: list[str]) -> list[str]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    return [*problems[:MAX_PROBLEMS], f"... and {len(problems) - MAX_PROBLEMS} more problem(s)"]


def validate_spec(source: str, host: str, data: dict[str, Any]) -> HostSpec:
    """Validate raw spec data; raise :class:`SpecError` naming every problem."""
    if not isinstance(data, dict):
        raise SpecError(
            source, host, [f"spec = {show(data)}: the spec is a mapping of fields, in {{ }}"]
        )
    try:
        return HostSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, host, describe(exc)) from None
