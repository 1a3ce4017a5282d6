"""Audit one inventory host: read it (and its GPU containers), make its Plan, run every check."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from gpuhost.audit import (  # noqa: F401  (registers the checks)
    driver_checks,
    guest_checks,
    host_checks,
    monitoring_checks,
    p2p_checks,
    readiness_checks,
    software_checks,
    storage_checks,
)
from gpuhost.audit.context import AuditContext
from gpuhost.audit.model import CHECKS, Check, Finding, NotApplicable, Outcome
from gpuhost.audit.observe import GuestView, Runner, in_container, observe_guest, observe_host
from gpuhost.observe.cuda import DEFAULT_SIZES
from gpuhost.plan.make import make_plan
from gpuhost.plan.model import PlanError
from gpuhost.spec.guests import LxcGuest
from gpuhost.spec.host import HostSpec


@dataclass
class Counted:
    """A runner that counts the remote commands it sends."""

    run: Runner
    commands: int = 0

    def __call__(self, command: str) -> tuple[int, str, str]:
        self.commands += 1
        return self.run(command)


@dataclass
class HostAudit:
    name: str
    spec: HostSpec
    context: AuditContext | None = None
    refused: PlanError | None = None
    commands: int = 0
    seconds: float = 0.0
    guest_access: dict[str, str] = field(default_factory=dict)  # guest -> how it was read
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # key: target::check


def gpu_containers(spec: HostSpec) -> list[LxcGuest]:
    return [g for g in spec.lxc_guests if g.gpus]


def read_host(
    name: str,
    spec: HostSpec,
    run: Runner,
    guest_runner: Callable[[LxcGuest], Runner] | None = None,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    source: str | None = None,
    guests: bool = True,
) -> HostAudit:
    """One command on the host, one per GPU container (unless ``guests`` is False), side by
    side; then the Plan."""
    started = time.monotonic()
    counted = Counted(run)
    audit = HostAudit(name, spec)

    def read_guest(guest: LxcGuest) -> tuple[GuestView, int]:
        if guest.access.ssh_hostname and guest_runner is not None:
            own = Counted(guest_runner(guest))
            audit.guest_access[guest.name] = (
                f"ssh {guest.access.ssh_user}@{guest.access.ssh_hostname}"
            )
            return observe_guest(own, sizes, guest), own.commands
        audit.guest_access[guest.name] = f"pct exec {guest.ctid} on {name}"
        through_host = Counted(run)  # pct exec on the host
        view = observe_guest(
            lambda script: through_host(in_container(guest.ctid, script)), sizes, guest
        )
        return view, through_host.commands

    containers = gpu_containers(spec) if guests else []
    # The guests' CUDA probes run while the host's does: the audit takes the longest, not the sum.
    with ThreadPoolExecutor(max_workers=max(1, len(containers))) as pool:
        reads = {g.ctid: pool.submit(read_guest, g) for g in containers}
        view = observe_host(counted, sizes)
        guests: dict[int, GuestView] = {}
        for ctid, future in reads.items():
            guests[ctid], commands = future.result()
            counted.commands += commands
    audit.commands, audit.seconds = counted.commands, time.monotonic() - started
    try:
        plan = make_plan(name, spec, view.facts, source)
    except PlanError as exc:
        audit.refused = exc
        return audit
    audit.context = AuditContext(name, spec, plan, view, guests, sizes)
    return audit


# Report order: the hardware first, then what builds on it, the guests last.
ORDER = (
    "gpus",
    "driver",
    "boot",
    "storage",
    "modules",
    "devices",
    "cuda",
    "p2p",
    "monitoring",
    "ct",
    "vm",
)


def ordered_checks(scope: str) -> list[Check]:
    found = [c for c in CHECKS.values() if c.scope == scope]
    return sorted(found, key=lambda c: ORDER.index(c.id.split(".")[0]))


def cases(spec: HostSpec) -> list[tuple[Check, str | None]]:
    """(check, guest name) for every check that applies to this spec's host and guests."""
    out: list[tuple[Check, str | None]] = [(c, None) for c in ordered_checks("host")]
    for guest in spec.guests:
        kind = "lxc" if isinstance(guest, LxcGuest) else "vm"
        out += [(c, guest.name) for c in ordered_checks(kind)]
    return out


def evaluate(audit: HostAudit, check: Check, guest_name: str | None) -> Outcome:
    target = audit.name if guest_name is None else f"{audit.name}/{guest_name}"
    outcome = Outcome(check, target)
    if audit.refused is not None:
        outcome.findings = [
            Finding(
                "the plan",
                "a Plan for this host",
                problem,
                "fix the inventory or the host; the audit checks against the Plan",
            )
            for problem in audit.refused.problems
        ]
        return outcome
    ctx = audit.context
    assert ctx is not None
    try:
        if guest_name is None:
            outcome.findings = check.run(ctx)
        else:
            guest = next(g for g in ctx.spec.guests if g.name == guest_name)
            outcome.findings = check.run(ctx, guest)
    except NotApplicable as skip:
        outcome.skipped = str(skip)
    key = check.id if guest_name is None else f"{check.id}/{guest_name}"
    outcome.details = ctx.details.get(key, {})
    return outcome


def audit_all(audit: HostAudit) -> list[Outcome]:
    return [evaluate(audit, c, g) for c, g in cases(audit.spec)]
