"""A probe: one shell command that reads part of a host, and the pure parser of its output.

Probes are plain Python so the planner, the audit and snapshots use them without pyinfra; the
pyinfra facts in ``facts/`` are the same probes run by pyinfra (they inherit from them).
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Probe(Generic[T]):
    # The binary the command needs; where it is absent the probe's value is ``default()``
    # (the way pyinfra treats a fact's ``requires_command``).
    requires_command: str | None = None
    # Commands the probe ran before its current one: captures made with them still parse
    # (tests/unit/test_fact_captures.py accepts a capture's .cmd if it is one of them).
    earlier_commands: tuple[str, ...] = ()

    @staticmethod
    def default() -> T:  # type: ignore[misc]
        return None  # type: ignore[return-value]

    def command(self) -> str:
        raise NotImplementedError

    def process(self, output: list[str]) -> T:
        raise NotImplementedError
