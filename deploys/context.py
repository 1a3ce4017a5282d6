"""What every concern's deploy needs: the spec, the host's state read in one round trip, the plan."""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api.exceptions import DeployError

from facts.snapshot import Combined
from gpuhost.hostfacts import DEPLOY_FACTS, HostFacts, combined_args, parse_deploy_extras, parse_raw
from gpuhost.inventory import SPEC_KEY
from gpuhost.plan import Plan, PlanError, make_plan
from gpuhost.render import render_plan
from gpuhost.spec import HostSpec


@dataclass
class Context:
    spec: HostSpec
    facts: HostFacts
    files: dict[str, str]  # managed config files as they are now
    boot_id: str
    plan: Plan


def load() -> Context:
    """Read the host once, plan, and print the plan. A refused plan stops before any change."""
    spec = host.data.get(SPEC_KEY)
    if not isinstance(spec, HostSpec):
        raise DeployError(
            f"{host.name}: no gpuhost spec in host data; declare the host with "
            "gpuhost.inventory.gpu_host() in the inventory"
        )
    raw = host.get_fact(Combined, **combined_args(tuple(DEPLOY_FACTS)))
    facts = parse_raw(raw)
    files, boot_id = parse_deploy_extras(raw)
    try:
        plan = make_plan(host.name, spec, facts)
    except PlanError as exc:
        raise DeployError(str(exc)) from None
    logger.info(f"{host.print_prefix}\n{render_plan(plan)}")
    return Context(spec=spec, facts=facts, files=files, boot_id=boot_id, plan=plan)
