"""What a run needs from outside the host before it may change anything (pure; part of the Plan).

A run that stops halfway leaves the host worse than one that never started: guests stopped, a
board on another driver, a kernel pinned. So everything the run will need from the control
machine is named here while planning, with whether it holds: the Proxmox API token when the
run writes through the API, the driver installer and source tree when they will be used, the
artifact store or build host when the kernel must come from it. `gpuhost plan` prints them and
the deploy refuses before its first operation when one fails (deploys/context.py).

The control machine is read once, before planning, into :class:`ControlFacts`
(gpuhost/control.py); this module only decides which of those reads the run needs.
A failure's text names the spec field and the fix; it never holds a secret (the token's own
errors name the variable or file, never the value: gpuhost/pve/api.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.observe.proxmox import MAPPINGS_FILE, parse_pci_mappings
from gpuhost.plan.driver.modules import DriverModules
from gpuhost.plan.driver.userspace import DriverUserspace
from gpuhost.plan.guests.vms import MAPPING_PREFIX, VmSplit
from gpuhost.spec.host import HostSpec


@dataclass(frozen=True)
class ControlFacts:
    """What the control machine showed: for each thing a run may need, None when it is there
    and usable, else what is wrong with it and the fix."""

    token: str | None = None  # the API token (proxmox.token_file / token_env)
    files: dict[str, str | None] = field(default_factory=dict)  # driver.source files by path
    tree: str | None = None  # driver.source.tree builds driver.version
    modules_stored: bool = False  # driver.source.store holds the modules for the Plan's kernel
    kernel_store: str | None = None  # the store (or build host) has the spec's kernel


@dataclass(frozen=True)
class Precondition:
    """One thing the run needs: which spec field names it, what for, and whether it holds."""

    name: str  # the spec field: "proxmox.token_file"
    needs: str  # what the run needs it for
    problem: str | None = None  # None: it holds
    checked: bool = True  # False: the control machine was not read (a plan made without it)

    @property
    def holds(self) -> bool:
        return self.checked and self.problem is None

    def line(self) -> str:
        state = "ok" if self.holds else "FAILED" if self.checked else "not checked"
        detail = f": {self.problem}" if self.problem else ""
        return f"{state:<11} {self.name} (needed {self.needs}){detail}"


def api_writes(split: VmSplit, facts: HostFacts) -> list[str]:
    """What this run changes through the API token: PCI mappings of this node that differ from
    the Plan (or are gpuhost's and no longer wanted) and VM configs with owned entries to set,
    delete or a machine type to change. Empty: the run never calls the API."""
    managed = facts.managed
    node = (managed.links.get("/etc/pve/local", "") if managed else "").removeprefix("nodes/")
    live = parse_pci_mappings((managed.files.get(MAPPINGS_FILE) or "") if managed else "")
    writes = []
    for mid, mapping in sorted(split.mappings.items()):
        have = live.get(mid)
        mine = [m for m in (have.maps if have else ()) if f"node={node}" in m.split(",")]
        if mine != [mapping.map_entry(node)]:
            writes.append(f"PCI mapping {mid}")
    for mid in sorted(set(live) - set(split.mappings)):
        if mid.startswith(MAPPING_PREFIX) and any(
            f"node={node}" in m.split(",") for m in live[mid].maps
        ):
            writes.append(f"PCI mapping {mid} (removed)")
    for vmid, vm in sorted(split.vms.items()):
        if vm.exists and (set(vm.hostpci) - set(vm.adopt) or vm.delete or vm.machine):
            writes.append(f"vm {vmid}'s GPU entries")
    return writes


def kernel_from_store(spec: HostSpec, facts: HostFacts) -> bool:
    """The run installs the spec's kernel from the artifact store (deploys/kernel.py): a built
    kernel that neither runs nor is installed."""
    release = spec.kernel.version
    if spec.kernel.source != "build" or release == facts.kernel.release:
        return False
    return "boot" not in facts.compilers.kernels.get(release, {})


def plan_preconditions(
    spec: HostSpec,
    facts: HostFacts,
    api: list[str],
    modules: DriverModules | None,
    userspace: DriverUserspace | None,
    control: ControlFacts | None,
) -> list[Precondition]:
    """The preconditions this run has, each with what it needs it for and its result.

    + api: :func:`api_writes` of the Plan's VM side
    + control: what the control machine showed; None: not read (every one "not checked")
    """
    seen = control or ControlFacts()
    found: list[Precondition] = []

    def need(name: str, needs: str, problem: str | None) -> None:
        found.append(Precondition(name, needs, problem, checked=control is not None))

    if api:
        where = "proxmox.token_file" if spec.proxmox.token_file else "proxmox.token_env"
        shown = ", ".join(api[:3]) + (f" and {len(api) - 3} more" if len(api) > 3 else "")
        need(where, f"to write through the Proxmox API: {shown}", seen.token)
    if userspace is not None:
        need(
            "driver.source.installer",
            f"to install the NVIDIA {userspace.version} userspace and GSP firmware where the "
            "host lacks them",
            seen.files.get(userspace.installer),
        )
        if userspace.fabricmanager is not None:
            need(
                "driver.source.fabricmanager",
                f"for the {len(userspace.nvswitches)} NVSwitches",
                seen.files.get(userspace.fabricmanager),
            )
    if modules is not None and not seen.modules_stored:
        need(
            "driver.source.tree",
            f"to build the NVIDIA {modules.version} modules for {modules.kernel} (none in "
            f"driver.source.store {modules.store})",
            seen.tree,
        )
    if kernel_from_store(spec, facts):
        where = "artifacts.build_host" if spec.artifacts.build_host else "artifacts.store"
        need(where, f"to install kernel {spec.kernel.version} from it", seen.kernel_store)
    return found


def unmet(preconditions: list[Precondition]) -> list[Precondition]:
    return [p for p in preconditions if not p.holds]
