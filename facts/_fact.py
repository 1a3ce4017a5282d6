"""The base of gpuhost's pyinfra facts: a probe's command and parser under pyinfra.

A probe (:class:`gpuhost.observe.probe.Probe`) is plain Python: the planner and the audit use it
without pyinfra. A fact class puts the probe first and pyinfra's ``FactBase`` last, so pyinfra
sees the probe's own ``command`` signature (it binds fact arguments by it) and this class turns
a parser's refusal into pyinfra's ``FactProcessError``: pyinfra then reports the fact and fails
that host instead of aborting the whole run.
"""

from __future__ import annotations

from typing import Any

from pyinfra.api.exceptions import FactProcessError

from gpuhost.observe.parse import UnparsedOutput


class Fact:
    def process(self, output: list[str]) -> Any:
        try:
            return super().process(output)  # type: ignore[misc]
        except UnparsedOutput as exc:
            raise FactProcessError(str(exc)) from exc
