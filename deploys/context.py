"""The host's state, read once per run in one round trip, and the Plan made from it.

Operations read what they compare against from :func:`observed` (one batched, cached fact per
host) instead of probing the host per item, so a converged re-run costs one remote command for
facts. The cache holds the state as it was when the run started: at execution pyinfra runs each
operation again, and it must decide exactly what it decided at preparation (and showed in --dry).
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api.exceptions import DeployError
from pyinfra.api.host import Host

from deploys import prefetch
from facts.snapshot import Combined
from gpuhost.control import read_control
from gpuhost.observe.hostfacts import HostFacts, combined_args, parse_raw
from gpuhost.plan.make import Plan, make_plan
from gpuhost.plan.model import PlanError
from gpuhost.plan.preconditions import unmet
from gpuhost.plan.render import render_plan
from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import SOURCE_KEY, SPEC_KEY

_observed: dict[tuple[int, str], HostFacts] = {}
_plans: dict[tuple[int, str], Plan] = {}


def _key(host: Host) -> tuple[int, str]:
    return (id(host.state), host.name)


def observed(host: Host) -> HostFacts:
    """Everything gpuhost reads on ``host``, from one remote command, cached for the run."""
    key = _key(host)
    if key not in _observed:
        raw = prefetch.take(host)  # sent by the deploy file's first lines, if it did
        if raw is None:
            raw = host.get_fact(Combined, **combined_args())
        _observed[key] = parse_raw(raw)
    return _observed[key]


def plan(host: Host) -> Plan:
    """The host's Plan (made and printed once per run). A refused plan stops before any change."""
    key = _key(host)
    if key not in _plans:
        spec = host.data.get(SPEC_KEY)
        if not isinstance(spec, HostSpec):
            raise DeployError(
                f"{host.name}: no gpuhost spec in host data; declare the host with "
                "gpuhost.spec.inventory.gpu_host() in the inventory"
            )
        source = host.data.get(SOURCE_KEY)
        facts = observed(host)
        try:
            made = make_plan(host.name, spec, facts, source, read_control(spec, facts, source))
        except PlanError as exc:
            raise DeployError(str(exc)) from None
        logger.info(f"{host.print_prefix}\n{render_plan(made)}")
        _plans[key] = made
    return _plans[key]


def refuse_unmet(plan: Plan, host: Host) -> None:
    """Stop while pyinfra prepares, before any operation runs, unless everything the run needs
    from the control machine is there (gpuhost/plan/preconditions.py): a run must not stop guests
    or move a board and only then find the token or a file missing."""
    failed = unmet(plan.preconditions)
    if failed:
        raise DeployError(
            f"{host.name}: nothing was changed: {len(failed)} precondition(s) of this run "
            "failed:\n" + "\n".join(f"  - {p.line()}" for p in failed)
        )


def made_plan(host: Host) -> Plan | None:
    """The Plan this run already made for ``host``, if any (deploys that make none: None)."""
    return _plans.get(_key(host))
