"""Readiness checks: every GPU guest starts through gpuhost's hookscript, with its contract as
planned (gpuhost/plan/guests/readiness.py), so a start without its GPUs ready is held back."""

from __future__ import annotations

from gpuhost.audit.context import REDEPLOY, AuditContext
from gpuhost.audit.model import Finding, NotApplicable, check
from gpuhost.paths import HOOKSCRIPT
from gpuhost.plan.guests.readiness import ready_path
from gpuhost.pve.backup import config_path
from gpuhost.spec.guests import LxcGuest, VmGuest


def _hook(ctx: AuditContext, kind: str, vmid: int, name: str) -> list[Finding]:
    readiness = ctx.plan.readiness
    if not ctx.spec.readiness.enabled:
        raise NotApplicable("readiness.enabled is false")
    hook = readiness.hooks.get((kind, vmid))
    if hook is None or (kind, vmid) not in readiness.contracts:
        raise NotApplicable(f"{name} has no GPUs here, or does not exist")
    findings = []
    if hook.current != hook.wanted:
        findings.append(
            Finding(
                config_path(kind, vmid),
                f"hookscript: {hook.wanted}",
                f"hookscript: {hook.current}" if hook.current else "no hookscript",
                REDEPLOY + " (a hookscript of the guest's own is kept: gpuhost's runs it)",
            )
        )
    files = ctx.host.facts.files or {}
    for path, what in ((HOOKSCRIPT, "gpuhost's hookscript"), (ready_path(vmid), "its contract")):
        planned = ctx.plan.files[path].content
        found = files.get(path)
        if found != planned:
            findings.append(
                Finding(
                    path,
                    f"{what}, as planned",
                    "missing" if found is None else "other content",
                    REDEPLOY,
                )
            )
    return findings


@check("ct.readiness_hook", "The container starts through gpuhost's readiness check", "lxc")
def ct_readiness_hook(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    return _hook(ctx, "lxc", guest.ctid, guest.name)


@check("vm.readiness_hook", "The VM starts through gpuhost's readiness check", "vm")
def vm_readiness_hook(ctx: AuditContext, guest: VmGuest) -> list[Finding]:
    return _hook(ctx, "qemu", guest.vmid, guest.name)
