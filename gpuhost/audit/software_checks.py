"""Guest software checks, inside each GPU container: CUDA toolkits, venv pins and imports, the
managed environment, services. The expectation is the guest plan (gpuhost/guestsw/plan.py) made
from the host's Plan (its environment for the guest) and what the guest showed, exactly as the
guest deploy makes it."""

from __future__ import annotations

from gpuhost.audit.context import AuditContext
from gpuhost.audit.model import Finding, NotApplicable, check
from gpuhost.guestsw.control import control_for
from gpuhost.guestsw.model import PROFILE, GuestPlan, GuestPlanError
from gpuhost.guestsw.plan import make_guest_plan
from gpuhost.plan.guests.split import owner_of_guest
from gpuhost.spec.guests import LxcGuest

_PYTHON_MATCH = 2  # major.minor of a venv's python


def redeploy(guest: LxcGuest) -> str:
    return f"re-run the guest deploy (pyinfra INVENTORY deploys/gpu_guest.py --limit {guest.name})"


class _Refused(Exception):
    def __init__(self, finding: Finding) -> None:
        self.finding = finding


def _plan(
    ctx: AuditContext, guest: LxcGuest, applies: bool = True, what: str = "", report: bool = True
) -> GuestPlan:
    if not (guest.cuda or guest.venvs):
        raise NotApplicable(f"{guest.name} has no guest software in the spec")
    if not applies:  # decided from the spec, before the plan (a refused plan is one finding)
        raise NotApplicable(f"{guest.name} has no {what}")
    view = ctx.guests.get(guest.ctid)
    if view is None or view.unreachable or view.software is None:
        why = view.unreachable if view and view.unreachable else "it was not read"
        raise NotApplicable(f"{guest.name}: {why}")
    cache = ctx.details_for(f"guestplan/{guest.name}")
    if "plan" not in cache:
        env = ctx.plan.guest_env.get(owner_of_guest(guest), {})
        try:
            cache["plan"] = make_guest_plan(
                guest.name, guest, env, view.software, control_for(guest)
            )
        except GuestPlanError as exc:
            cache["plan"] = exc
    made = cache["plan"]
    if isinstance(made, GuestPlanError) and not report:
        raise NotApplicable("its software plan is refused (ct.toolkits / ct.venvs say why)")
    if isinstance(made, GuestPlanError):
        raise _Refused(
            Finding(
                f"the software plan of {guest.name}",
                "a plan that can work",
                "; ".join(made.problems),
                "correct the spec or the host (the guest deploy refuses it the same way)",
            )
        )
    return made


def _guarded(fn):
    def run(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
        try:
            return fn(ctx, guest)
        except _Refused as refused:
            return [refused.finding]

    run.__doc__ = fn.__doc__
    return run


@check(
    "ct.toolkits", "CUDA toolkits at the planned versions, the default at /usr/local/cuda", "lxc"
)
@_guarded
def ct_toolkits(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    plan = _plan(ctx, guest, bool(guest.cuda), "CUDA toolkits")
    sw = ctx.guests[guest.ctid].software
    assert sw is not None
    findings = []
    for tk in plan.toolkits:
        found = sw.cuda_versions.get(tk.prefix)
        if tk.package not in sw.toolkits:
            findings.append(
                Finding(
                    f"{tk.package} in {guest.name}", "installed", "not installed", redeploy(guest)
                )
            )
        elif found is None or found.split(".")[:2] != tk.version.split("."):
            findings.append(
                Finding(
                    f"{tk.prefix}/version.json in {guest.name}",
                    f"CUDA {tk.version}.x",
                    found or "missing",
                    f"reinstall {tk.package} (apt-get install --reinstall {tk.package})",
                )
            )
    default = plan.default
    if default and (
        sw.cuda_alternative != default.prefix or sw.cuda_link != "/etc/alternatives/cuda"
    ):
        findings.append(
            Finding(
                f"/usr/local/cuda in {guest.name}",
                f"-> /etc/alternatives/cuda -> {default.prefix} (cuda_default)",
                f"-> {sw.cuda_link or 'missing'} -> {sw.cuda_alternative or 'no cuda alternative'}",
                f"update-alternatives --set cuda {default.prefix}, or {redeploy(guest)}",
            )
        )
    return findings


@check("ct.venvs", "Each venv holds its pins at their versions and its imports work", "lxc")
@_guarded
def ct_venvs(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    plan = _plan(ctx, guest, bool(guest.venvs), "venvs")
    sw = ctx.guests[guest.ctid].software
    assert sw is not None
    findings = []
    for venv in plan.venvs:
        state = sw.venvs.get(venv.path)
        if state is None or state.python is None:
            findings.append(
                Finding(f"venv {venv.path}", f"python {venv.python}", "missing", redeploy(guest))
            )
            continue
        if state.python.split(".")[:_PYTHON_MATCH] != venv.python.split(".")[:_PYTHON_MATCH]:
            findings.append(
                Finding(
                    f"venv {venv.path}",
                    f"python {venv.python}",
                    f"python {state.python}",
                    redeploy(guest),
                )
            )
        for name, pin in venv.pins.items():
            if state.dists.get(name) != pin:
                findings.append(
                    Finding(
                        f"{name} in {venv.path}",
                        f"{pin} (pinned)",
                        state.dists.get(name, "not installed"),
                        f"{redeploy(guest)}: it reinstalls under the pins "
                        "(something installed without them moved it)",
                    )
                )
        if venv.imports and state.imports != "ok":
            findings.append(
                Finding(
                    f"import {', '.join(venv.imports)} in {venv.path}",
                    "imports",
                    state.imports or "not checked (no python)",
                    f"{redeploy(guest)}, or repair the venv",
                )
            )
    return findings


@check("ct.environment", "The guest's NCCL/CUDA environment equals the Plan", "lxc")
@_guarded
def ct_environment(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    plan = _plan(ctx, guest, report=False)
    view = ctx.guests[guest.ctid]
    sw = view.software
    assert sw is not None
    findings = []
    for name, value in sorted(plan.env.items()):
        if view.env.get(name) != value:
            findings.append(
                Finding(
                    f"{name} in a login shell of {guest.name}",
                    value,
                    view.env.get(name, "unset"),
                    redeploy(guest),
                )
            )
    for item in plan.files.values():
        if item.path == PROFILE or item.path.startswith("/etc/gpuhost/venvs/"):
            found = sw.files.files.get(item.path)
            if found != item.content:
                findings.append(
                    Finding(
                        f"{item.path} in {guest.name}",
                        "the Plan's content",
                        "missing" if found is None else "different content",
                        redeploy(guest),
                    )
                )
    return findings


@check("ct.services", "Venv services are active with the planned environment", "lxc")
@_guarded
def ct_services(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    plan = _plan(ctx, guest, any(v.service for v in guest.venvs), "services")
    sw = ctx.guests[guest.ctid].software
    assert sw is not None
    findings = []
    for svc in plan.services:
        state = sw.services.get(svc.name)
        if state is None or state.active != "active":
            findings.append(
                Finding(svc.unit, "active", state.active if state else "unknown", redeploy(guest))
            )
            continue
        if state.enabled != "enabled":
            findings.append(
                Finding(svc.unit, "enabled", state.enabled or "unknown", redeploy(guest))
            )
        if state.stamp != svc.stamp:
            findings.append(
                Finding(
                    svc.unit,
                    "started with its current unit, environment and venv",
                    "started before one of them changed",
                    f"systemctl restart {svc.unit}, or {redeploy(guest)}",
                )
            )
        wanted = _env_file_values(plan.files[f"{_venv_dir(plan, svc.venv)}/env"].content or "")
        wrong = sorted(k for k, v in wanted.items() if state.environ.get(k) != v)
        if wrong:
            findings.append(
                Finding(
                    f"{svc.unit} (pid {state.pid}) environment",
                    ", ".join(f"{k}={wanted[k]}" for k in wrong),
                    ", ".join(f"{k}={state.environ.get(k, 'unset')}" for k in wrong),
                    f"systemctl restart {svc.unit}, or {redeploy(guest)}",
                )
            )
    return findings


def _venv_dir(plan: GuestPlan, path: str) -> str:
    return next(v.config_dir for v in plan.venvs if v.path == path)


def _env_file_values(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key] = value
    return values
