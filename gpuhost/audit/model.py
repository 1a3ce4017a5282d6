"""Findings and check registration for the audit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finding:
    """One way the host differs from the Plan: what, expected, found, and the fix."""

    subject: str
    expected: str
    found: str
    fix: str

    def render(self) -> str:
        return (
            f"{self.subject}:\n    expected: {self.expected}\n    found:    {self.found}\n"
            f"    fix:      {self.fix}"
        )


class NotApplicable(Exception):
    """The check does not apply to this host or guest; the message says why (a skip)."""


@dataclass(frozen=True)
class Check:
    id: str  # "driver.version"
    title: str
    scope: str  # "host" | "lxc" | "vm"
    run: Callable[..., list[Finding]]


@dataclass
class Outcome:
    check: Check
    target: str  # "kpro6" or "kpro6/ct200"
    findings: list[Finding] = field(default_factory=list)
    skipped: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "skipped" if self.skipped else "failed" if self.findings else "passed"


CHECKS: dict[str, Check] = {}


def check(check_id: str, title: str, scope: str = "host") -> Callable[..., Any]:
    """Register a check function ``(ctx[, guest]) -> list[Finding]`` under ``check_id``."""

    def register(fn: Callable[..., list[Finding]]) -> Callable[..., list[Finding]]:
        if check_id in CHECKS:
            raise ValueError(f"audit check {check_id} registered twice")
        CHECKS[check_id] = Check(check_id, title, scope, fn)
        return fn

    return register


def checks_for(scope: str) -> list[Check]:
    return [c for c in CHECKS.values() if c.scope == scope]
