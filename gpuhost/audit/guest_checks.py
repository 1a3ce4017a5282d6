"""Guest checks: container device rules and what CUDA sees inside; VM passthrough entries."""

from __future__ import annotations

import re
from typing import Any

from gpuhost.audit import p2p_checks
from gpuhost.audit.context import (
    REDEPLOY,
    AuditContext,
    container_userspace_fix,
    expected_minor,
)
from gpuhost.audit.model import Finding, NotApplicable, check
from gpuhost.audit.observe import GuestView
from gpuhost.observe.proxmox import MAPPINGS_FILE, GuestConfig, parse_pci_mappings
from gpuhost.plan.guests.containers import ALLOW_KEY, current_dev_paths, parse_rule
from gpuhost.spec.grammar import Q35_FIX, machine_is_q35
from gpuhost.spec.guests import LxcGuest, VmGuest


def _bdfs(ctx: AuditContext, guest: LxcGuest | VmGuest) -> list[str]:
    return [
        a.bdf for a in ctx.plan.gpus if a.owner.kind == guest.kind and a.owner.id == guest.guest_id
    ]


def _config(ctx: AuditContext, kind: str, vmid: int) -> GuestConfig:
    config = ctx.host.facts.guest_configs.get((kind, vmid))
    if config is None:
        where = "/etc/pve/lxc" if kind == "lxc" else "/etc/pve/qemu-server"
        raise _Missing(
            Finding(
                f"{where}/{vmid}.conf",
                "the guest's config",
                "missing",
                "create the guest, or correct the inventory",
            )
        )
    return config


class _Missing(Exception):
    def __init__(self, finding: Finding) -> None:
        self.finding = finding


def _guarded(fn: Any) -> Any:
    def run(ctx: AuditContext, guest: Any) -> list[Finding]:
        try:
            return fn(ctx, guest)
        except _Missing as missing:
            return [missing.finding]

    run.__doc__ = fn.__doc__
    return run


def _view(ctx: AuditContext, guest: LxcGuest) -> GuestView:
    if not _bdfs(ctx, guest):
        raise NotApplicable(f"{guest.name} has no GPUs")
    view = ctx.guests.get(guest.ctid)
    if view is None:
        raise NotApplicable(f"{guest.name} was not read")
    if view.unreachable:
        missing = "does not exist" in view.unreachable
        fix = "create it, or correct the inventory" if missing else f"pct start {guest.ctid}"
        raise _Missing(Finding(guest.name, "running and reachable", view.unreachable, fix))
    return view


# --- container config ----------------------------------------------------------------------------


@check("ct.device_rules", "Container device entries match the live majors, nothing broader", "lxc")
@_guarded
def ct_device_rules(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    planned = ctx.plan.lxc_nodes.get(guest.ctid)
    if not planned:
        raise NotApplicable(f"{guest.name} has no GPUs")
    config = _config(ctx, "lxc", guest.ctid)
    conf = f"/etc/pve/lxc/{guest.ctid}.conf"
    raw = config.current.raw
    v1_live = ctx.host.facts.cgroup_v1_devices
    findings = [
        Finding(
            f"{conf}: {k} {v.strip()}",
            "lxc.cgroup2.devices.allow (or devN entries)",
            "a cgroup v1 rule, which LXC ignores on this pure cgroup2 host",
            f"remove it; {REDEPLOY} (devN entries), then restart {guest.name}",
        )
        for k, v in raw
        if k == "lxc.cgroup.devices.allow" and not v1_live
    ]
    rules = [
        v.strip()
        for k, v in raw
        if ALLOW_KEY.fullmatch(k) and (v1_live or k != "lxc.cgroup.devices.allow")
    ]
    mounts = [v.split()[0] for k, v in raw if k == "lxc.mount.entry" and v.split()]
    devs = current_dev_paths(config)
    live = set(ctx.host.facts.char_devices.values())
    nvidia = ctx.live_major("/dev/nvidia0")
    gpu_nodes = {
        n for n in planned if expected_minor(n) is not None and n[len("/dev/nvidia") :].isdigit()
    }
    for rule in rules:
        m = parse_rule(rule)
        if m is None or m.type == "a" or m.major is None:
            findings.append(
                Finding(
                    f"{conf}: allow {rule}",
                    "rules for the GPU nodes' majors only",
                    "a blanket rule: every device of the host",
                    "remove it; grant the planned nodes only (devN entries)",
                )
            )
        elif (
            m.major == nvidia
            and m.minor == "*"
            and len(gpu_nodes) < len([a for a in ctx.plan.gpus if a.driver_planned == "nvidia"])
        ):
            findings.append(
                Finding(
                    f"{conf}: allow {rule}",
                    f"only its GPUs' minors ({', '.join(sorted(gpu_nodes))})",
                    "every GPU of the host",
                    "grant c 195:<minor> per assigned GPU (and 195:255 for nvidiactl)",
                )
            )
        elif m.type == "c" and m.major not in live:
            findings.append(
                Finding(
                    f"{conf}: allow {rule}",
                    "the live majors of /proc/devices",
                    f"major {m.major}, which no device has now: a stale (dynamic) nvidia-uvm/caps major",
                    f"the uvm major moved (now {ctx.live_major('/dev/nvidia-uvm')}): {REDEPLOY}, "
                    f"then restart {guest.name} (pct reboot {guest.ctid}); devN entries do not go stale",
                )
            )
    minors_allowed = [
        (m.major, m.minor) for m in map(parse_rule, rules) if m and m.major is not None
    ]
    for path in planned:
        major, minor = ctx.live_major(path), expected_minor(path)
        if path in devs:
            continue
        by_rule = any(mj == major and mn in ("*", str(minor)) for mj, mn in minors_allowed)
        if not (by_rule and path in mounts):
            findings.append(
                Finding(
                    f"{conf}: {path}",
                    f"a devN entry (or an allow rule for {major}:{minor} and a mount entry)",
                    "not granted",
                    f"{REDEPLOY}, then restart {guest.name}",
                )
            )
    others = {
        n for n in [*devs, *mounts] if re.fullmatch(r"/dev/nvidia\d+", n) and n not in planned
    }
    for path in sorted(others):
        findings.append(
            Finding(
                f"{conf}: {path}",
                "only the GPUs assigned to it",
                "another GPU's node",
                f"remove it; {REDEPLOY}",
            )
        )
    return findings


@check("ct.privilege", "No privileged GPU container unless the spec allows it", "lxc")
@_guarded
def ct_privilege(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    if not _bdfs(ctx, guest):
        raise NotApplicable(f"{guest.name} has no GPUs")
    config = _config(ctx, "lxc", guest.ctid)
    if config.current.options.get("unprivileged") != "1" and not guest.privileged:
        return [
            Finding(
                f"/etc/pve/lxc/{guest.ctid}.conf",
                "unprivileged: 1",
                "a privileged container (root in it is root on the host)",
                "recreate it unprivileged, or set privileged: true for it in the inventory",
            )
        ]
    return []


# --- inside the container -----------------------------------------------------------------------


@check("ct.nodes", "Inside the container every GPU node has the host's live numbers", "lxc")
@_guarded
def ct_nodes(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    view = _view(ctx, guest)
    findings = []
    for path in ctx.plan.lxc_nodes.get(guest.ctid, ()):
        node = view.nodes.get(path)
        major, minor = ctx.live_major(path), expected_minor(path)
        if node is None:
            findings.append(
                Finding(
                    f"{path} in {guest.name}",
                    f"char {major}:{minor}",
                    "missing",
                    f"{REDEPLOY}, then restart {guest.name}",
                )
            )
        elif (node.major, node.minor) != (major, minor):
            findings.append(
                Finding(
                    f"{path} in {guest.name}",
                    f"char {major}:{minor} (the host's now)",
                    f"char {node.numbers}",
                    f"the major moved since {guest.name} started: restart {guest.name} after the deploy",
                )
            )
    return findings


@check("ct.userspace", "The container's NVIDIA userspace equals the host driver exactly", "lxc")
@_guarded
def ct_userspace(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    view = _view(ctx, guest)
    version = ctx.driver_version
    if version is None:
        raise NotApplicable("the host's nvidia module is not loaded")
    found = view.userspace.get("libcuda", [])
    if found != [version]:
        return [
            Finding(
                f"libcuda in {guest.name}",
                f"{version} (the host's /proc/driver/nvidia/version)",
                ", ".join(found) or "not installed",
                container_userspace_fix(ctx, guest.ctid, guest.name),
            )
        ]
    return []


_CUDA_FIX = {
    "CUDA_ERROR_UNKNOWN": "/dev/nvidia-uvm is not usable: a stale uvm major (ct.device_rules) or "
    "uvm_disable_hmm not Y (modules.parameters)",
    "CUDA_ERROR_NO_DEVICE": "no GPU node is usable: check the device rules and nodes (ct.nodes)",
}


@check("ct.cuda", "CUDA initialises in the container and sees exactly its GPUs", "lxc")
@_guarded
def ct_cuda(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    view = _view(ctx, guest)
    bdfs = _bdfs(ctx, guest)
    init = view.cuda.init if view.cuda else None
    if init is None or init == "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH":
        # libcuda missing, not loading or of another version: its install is the fix, which the
        # deploy does only with driver.source.installer (not a re-run without one)
        hint = f"{guest.name}'s NVIDIA userspace (ct.userspace): "
        hint += container_userspace_fix(ctx, guest.ctid, guest.name)
    else:
        hint = _CUDA_FIX.get(init, f"{REDEPLOY}, then restart {guest.name}")
    return p2p_checks.cuda_findings(guest.name, view, bdfs, hint)


@check("ct.p2p", "Peer copies between the container's GPUs come back intact", "lxc")
@_guarded
def ct_p2p(ctx: AuditContext, guest: LxcGuest) -> list[Finding]:
    view = _view(ctx, guest)
    bdfs = _bdfs(ctx, guest)
    details = ctx.details_for(f"ct.p2p/{guest.name}")
    findings = p2p_checks.data_findings(ctx, guest.name, view.cuda, bdfs, details)
    return findings + p2p_checks.unsafe_env_findings(ctx, guest.name, bdfs, view.env)


# --- VMs ----------------------------------------------------------------------------------------


def _mapped_paths(ctx: AuditContext) -> dict[str, str]:
    """mapping id -> this node's `path` in /etc/pve/mapping/pci.cfg (first path of a list)."""
    managed = ctx.host.facts.managed
    if managed is None:
        return {}
    node = managed.links.get("/etc/pve/local", "").removeprefix("nodes/")
    paths = {}
    for mid, mapping in parse_pci_mappings(managed.files.get(MAPPINGS_FILE, "")).items():
        for entry in mapping.maps:
            props = dict(item.partition("=")[::2] for item in entry.split(","))
            if props.get("node") == node and props.get("path"):
                paths[mid] = props["path"].split(";")[0]
    return paths


def _hostpci_functions(value: str, pci: dict[str, Any], mapped: dict[str, str]) -> set[str] | None:
    """The host functions a hostpciN value gives (a mapping through this node's map entry);
    None for a mapping this node has no entry for."""
    first = value.split(",", 1)[0]
    key, _, mid = first.partition("=")
    if key == "mapping":
        if mid not in mapped:
            return None
        ids = [mapped[mid]]
    else:
        ids = first.removeprefix("host=").split(";")
    found: set[str] = set()
    for pci_id in ids:
        full = pci_id if pci_id.count(":") == 2 else f"0000:{pci_id}"
        if "." in full:
            found.add(full)
        else:
            found.update(b for b in pci if b.startswith(full + "."))
    return found


@check("vm.hostpci", "VM hostpciN entries give exactly the Plan's functions", "vm")
@_guarded
def vm_hostpci(ctx: AuditContext, guest: VmGuest) -> list[Finding]:
    planned = set(ctx.plan.vm_functions.get(guest.vmid, ()))
    if not planned:
        raise NotApplicable(f"{guest.name} has no GPUs")
    config = _config(ctx, "qemu", guest.vmid)
    given: set[str] = set()
    mapped = _mapped_paths(ctx)
    for key, value in config.current.options.items():
        if re.fullmatch(r"hostpci\d+", key):
            functions = _hostpci_functions(value, ctx.host.facts.pci, mapped)
            if functions is None:
                return [
                    Finding(
                        f"/etc/pve/qemu-server/{guest.vmid}.conf {key}",
                        "a PCI mapping with a map entry for this node",
                        f"{value}: no such mapping in {MAPPINGS_FILE} for this node",
                        f"{REDEPLOY} (it creates gpuhost's mappings)",
                    )
                ]
            given |= functions
    conf = f"/etc/pve/qemu-server/{guest.vmid}.conf"
    findings = []
    if planned - given:
        findings.append(
            Finding(
                f"{conf} hostpci",
                ", ".join(sorted(planned)),
                f"missing {', '.join(sorted(planned - given))}",
                f"{REDEPLOY} (VM passthrough)",
            )
        )
    if given - planned:
        findings.append(
            Finding(
                f"{conf} hostpci",
                ", ".join(sorted(planned)),
                f"also {', '.join(sorted(given - planned))}",
                "remove the functions the VM does not own",
            )
        )
    return findings


@check("vm.machine", "A VM with GPUs is q35", "vm")
@_guarded
def vm_machine(ctx: AuditContext, guest: VmGuest) -> list[Finding]:
    if not ctx.plan.vm_functions.get(guest.vmid):
        raise NotApplicable(f"{guest.name} has no GPUs")
    config = _config(ctx, "qemu", guest.vmid)
    machine = config.current.options.get("machine", "")
    if not machine_is_q35(machine):
        return [
            Finding(
                f"/etc/pve/qemu-server/{guest.vmid}.conf machine",
                "q35 (PCIe passthrough needs it)",
                machine or "unset (i440fx)",
                f"qm set {guest.vmid} --machine q35 while it is stopped, or {Q35_FIX}",
            )
        ]
    return []
