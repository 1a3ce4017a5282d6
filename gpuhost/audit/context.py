"""What every check reads: the spec, the Plan made from it, and what the host and guests showed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuhost.audit.model import Finding
from gpuhost.audit.observe import GuestView, HostView
from gpuhost.plan.driver.userspace import INSTALLER_FLAGS, installer_name
from gpuhost.plan.guests.devices import node_major, node_minor
from gpuhost.plan.make import Plan
from gpuhost.plan.model import ManagedFile
from gpuhost.spec.host import HostSpec

REDEPLOY = "re-run the deploy (pyinfra INVENTORY deploys/gpu_host.py)"


@dataclass
class AuditContext:
    name: str  # the inventory's host name
    spec: HostSpec
    plan: Plan
    host: HostView
    guests: dict[int, GuestView] = field(default_factory=dict)  # ctid -> what the CT showed
    sizes: tuple[int, ...] = ()
    details: dict[str, dict[str, Any]] = field(default_factory=dict)  # per check: for the report

    def details_for(self, key: str) -> dict[str, Any]:
        return self.details.setdefault(key, {})

    @property
    def driver_version(self) -> str | None:
        """The loaded kernel driver's version: the truth every userspace must equal."""
        driver = self.host.facts.driver
        return driver.version if driver else None

    def live_major(self, node: str) -> int | None:
        """The major a device node must carry now, from /proc/devices."""
        return node_major(node, self.host.facts.char_devices)


expected_minor = node_minor  # the audit's name for it


def container_userspace_fix(ctx: AuditContext, ctid: int, name: str) -> str:
    """What gives container ``ctid`` the host driver's userspace. The deploy installs it into
    running GPU containers only with driver.source.installer (deploys/containers.py); without
    one, re-running the deploy changes nothing there, so the advice is the install itself."""
    version = ctx.driver_version or ctx.spec.driver.version
    if ctx.plan.driver_userspace is not None:
        return f"{REDEPLOY} while {name} runs: it installs the {version} userspace into it"
    run = installer_name(version)
    return (
        f"the deploy leaves {name}'s userspace alone (no driver.source.installer); on the host, "
        f"with NVIDIA's {run} in the current directory: `pct push {ctid} {run} /root/{run} && "
        f"pct exec {ctid} -- sh /root/{run} {INSTALLER_FLAGS} && "
        f"pct exec {ctid} -- rm /root/{run}`; or set driver.source.installer in the inventory "
        f"and {REDEPLOY}"
    )


def file_findings(ctx: AuditContext, managed: list[ManagedFile], fix: str) -> list[Finding]:
    """Managed files that differ from the Plan (content, presence or link target)."""
    seen = ctx.host.facts.managed
    if seen is None:
        return [Finding("managed files", "read", "not captured", fix)]
    findings = []
    for f in managed:
        if f.link is not None:
            found = seen.links.get(f.path)
            if found != f.link:
                findings.append(
                    Finding(
                        f.path,
                        f"a link to {f.link}",
                        f"link to {found}" if found else "missing",
                        fix,
                    )
                )
        elif f.content is None:
            if f.path in seen.files or f.path in seen.links:
                findings.append(Finding(f.path, "absent", "present", fix))
        else:
            found_text = seen.files.get(f.path)
            if found_text != f.content:
                state = "missing" if found_text is None else "different content"
                findings.append(Finding(f.path, "the Plan's content", state, fix))
    return findings
