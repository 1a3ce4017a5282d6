"""Which GPU goes to whom: guest references resolved to BDFs, IOMMU groups and VM machine types
checked. Pure: reads facts, never the host.
"""

from __future__ import annotations

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.observe.pci import PciDevice, nvswitches
from gpuhost.plan.model import HOST, Owner
from gpuhost.spec.grammar import Q35_FIX, machine_is_q35
from gpuhost.spec.guests import LxcGuest, VmGuest
from gpuhost.spec.host import HostSpec


def slot(bdf: str) -> str:
    return bdf.rsplit(".", 1)[0]


def owner_of_guest(guest: LxcGuest | VmGuest) -> Owner:
    return Owner("lxc" if isinstance(guest, LxcGuest) else "vm", guest.guest_id, guest.name)


def _describe(dev: PciDevice) -> str:
    driver = f", driver {dev.driver}" if dev.driver else ""
    return f"{dev.bdf} ([{dev.class_code[:4]}] {dev.vendor_device}{driver})"


def assign(spec: HostSpec, gpus: list[PciDevice], problems: list[str]) -> dict[str, Owner]:
    """Resolve each guest's GPU references to BDFs; collect every problem."""
    by_bdf = {g.bdf: i for i, g in enumerate(gpus)}
    owners: dict[str, tuple[Owner, str]] = {}  # bdf -> (owner, how it was named)
    rest: list[tuple[int, Owner]] = []
    for i, guest in enumerate(spec.guests):
        owner = owner_of_guest(guest)
        if guest.gpus == "rest":
            rest.append((i, owner))
            continue
        for ref in guest.gpus:
            if isinstance(ref, int):
                if ref >= len(gpus):
                    problems.append(
                        f"guests[{i}] ({owner}): GPU index {ref} does not exist; this host has "
                        f"{len(gpus)} NVIDIA GPU(s)"
                        + (f" (indexes 0-{len(gpus) - 1})" if gpus else "")
                    )
                    continue
                bdf, named = gpus[ref].bdf, f"index {ref}"
            else:
                if ref not in by_bdf:
                    known = ", ".join(by_bdf) or "none"
                    problems.append(
                        f"guests[{i}] ({owner}): {ref} is not an NVIDIA GPU on this host (GPUs: {known})"
                    )
                    continue
                bdf, named = ref, ref
            if bdf in owners and owners[bdf][0] != owner:
                other, other_named = owners[bdf]
                problems.append(
                    f"guests[{i}] ({owner}): GPU {bdf} (named as {named}) is already given to "
                    f"{other} (named as {other_named}); a GPU has exactly one owner"
                )
                continue
            owners[bdf] = (owner, named)
    for i, owner in rest:
        left = [g.bdf for g in gpus if g.bdf not in owners]
        if not left:
            problems.append(
                f"guests[{i}] ({owner}) takes 'rest' of the GPUs, but all {len(gpus)} GPU(s) "
                "are already given to other guests"
            )
        for bdf in left:
            owners[bdf] = (owner, "rest")
    return {bdf: owner for bdf, (owner, _) in owners.items()}


def check_iommu_groups(
    spec: HostSpec,
    facts: HostFacts,
    owners: dict[str, Owner],
    gpus: list[PciDevice],
    problems: list[str],
) -> list[str]:
    """A VM's GPU must take its whole IOMMU group: no other owner, no stray device in it.

    Groups are read from the running kernel. Where they will change at the next boot (the IOMMU
    is off now, or the planned ACS override is not active yet) the check cannot be made yet: it
    becomes a note, and the plan made after that boot (before any GPU is rebound) makes it.
    """
    vm_gpus = [g for g in gpus if owners.get(g.bdf, HOST).kind == "vm"]
    if vm_gpus and not facts.iommu_groups:
        return [
            "IOMMU groups are not visible (the IOMMU is off in the running kernel); the VM "
            "GPUs' isolation is checked after the reboot that turns it on"
        ]
    acs = spec.boot.acs_override
    pending = bool(acs) and f"pcie_acs_override={acs}" not in facts.cmdline
    found: list[str] = []
    gpu_slots = {slot(g.bdf): owners.get(g.bdf, HOST) for g in gpus}
    for gpu in vm_gpus:
        owner = owners[gpu.bdf]
        if gpu.iommu_group is None:
            continue
        reported = {slot(gpu.bdf)}
        for member in facts.iommu_groups.get(gpu.iommu_group, []):
            dev = facts.pci.get(member)
            if slot(member) in reported or dev is None or dev.is_bridge:
                continue  # bridges and root ports may share a VM's group
            reported.add(slot(member))
            other = gpu_slots.get(slot(member))
            if other == owner:
                continue  # another function or GPU of the same owner
            if other is not None:
                found.append(
                    f"IOMMU group {gpu.iommu_group} is split: {gpu.bdf} goes to {owner} but {member} "
                    f"goes to {other}; every device of a group must go to the same VM "
                    "(give both to one VM, or split the group with boot.acs_override)"
                )
            else:
                found.append(
                    f"IOMMU group {gpu.iommu_group} of {gpu.bdf} ({owner}) also holds "
                    f"{_describe(dev)}, which is not assigned with it; set boot.acs_override to "
                    "split the group, or keep this GPU on the host"
                )
    if pending:
        return [
            f"{f.split(';')[0]}; pcie_acs_override={acs} is not active yet: checked again after the reboot"
            for f in found
        ]
    problems.extend(found)
    return []


def check_vms(
    spec: HostSpec, facts: HostFacts, owners: dict[str, Owner], problems: list[str]
) -> list[str]:
    notes = []
    with_gpus = {o.id for o in owners.values() if o.kind == "vm"}
    for vm in spec.vm_guests:
        if vm.vmid not in with_gpus:
            continue
        config = facts.guest_configs.get(("qemu", vm.vmid))
        if vm.machine is not None:
            if config is None:
                notes.append(
                    f"vm {vm.vmid} ({vm.name}) has no config on this host yet; create it before deploying"
                )
            continue
        machine = config.current.options.get("machine") if config else None
        if config is None:
            problems.append(
                f"vm {vm.vmid} ({vm.name}) gets GPUs but does not exist here, so its machine type "
                "is unknown; create the VM or set machine: q35 in the spec"
            )
        elif not machine_is_q35(machine):
            shown = machine or "i440fx (the default, no 'machine' key)"
            problems.append(
                f"vm {vm.vmid} ({vm.name}) gets GPUs but its machine type is {shown}; PCIe "
                f"passthrough (hostpciN pcie=1) needs q35: {Q35_FIX}"
            )
    return notes


# NVIDIA Fabric Manager user guide (docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide),
# "Supported Deployment Models" and chapters "Bare Metal Mode", "Full Passthrough Virtualization
# Model", "Shared NVSwitch Virtualization Model": the NVSwitch fabric is either the host's with
# every GPU on it (bare metal), or every GPU goes to VMs (full passthrough: each VM's GPUs with
# their switches; shared NVSwitch: the switches stay with the hypervisor's fabric manager, which
# only activates partitions of GPUs for VMs). No model runs some baseboard GPUs on the host's
# driver while the others sit in VMs: the host's fabric manager, in bare-metal mode, wants every
# GPU of the fabric.
def check_fabric(
    facts: HostFacts, owners: dict[str, Owner], gpus: list[PciDevice], problems: list[str]
) -> None:
    """On an NVSwitch board the GPUs all stay on the host or all go to VMs."""
    switches = nvswitches(facts.pci)
    if not switches:
        return
    to_vms = [g.bdf for g in gpus if owners.get(g.bdf, HOST).kind == "vm"]
    on_host = [g.bdf for g in gpus if owners.get(g.bdf, HOST).kind != "vm"]
    if to_vms and on_host:
        problems.append(
            f"this host's GPUs share an NVSwitch fabric ({len(switches)} NVSwitches: "
            f"{', '.join(switches)}), and the split gives {', '.join(to_vms)} to VMs while "
            f"{', '.join(on_host)} stay on the host (host or containers): no Fabric Manager "
            "deployment model (bare metal, full passthrough, shared NVSwitch) supports that; "
            "give every GPU to the host and its containers, or every GPU to VMs"
        )
