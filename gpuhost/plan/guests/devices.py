"""The device nodes each GPU container needs and the PCI functions each VM is given, from the
Plan's GPU table."""

from __future__ import annotations

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.model import GpuAssignment

# The nodes every GPU container needs besides its GPUs' own: the control device and UVM
# (CUDA's unified memory; cuInit fails without it).
LXC_COMMON_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
MAX_MINOR = 254  # GPU minors are below the control device's (nvidiactl, 255)


def node_minor(node: str) -> int | None:
    """nvidiaN -> N, nvidiactl 255, nvidia-uvm 0, nvidia-uvm-tools 1 (the driver's minors)."""
    name = node.removeprefix("/dev/")
    fixed = {"nvidiactl": 255, "nvidia-uvm": 0, "nvidia-uvm-tools": 1}
    if name in fixed:
        return fixed[name]
    suffix = name.removeprefix("nvidia")
    return int(suffix) if suffix.isdigit() else None


def node_major(node: str, majors: dict[str, int]) -> int | None:
    """The live major of a node, from /proc/devices (nvidia-uvm's and nvidia-caps' are dynamic)."""
    name = node.removeprefix("/dev/")
    if name.startswith("nvidia-uvm"):
        return majors.get("nvidia-uvm")
    if name.startswith("nvidia-caps/"):
        return majors.get("nvidia-caps")
    return majors.get("nvidia", majors.get("nvidiactl"))


def planned_minors(
    assignments: list[GpuAssignment], facts: HostFacts, rebooting: bool
) -> dict[str, int]:
    """The minor (/dev/nvidiaN) each host GPU will have once the run is done.

    The driver gives a GPU the first free minor when it probes it and frees it when the GPU is
    removed (add_device/remove_device, kernel-open/nvidia/nv-frontend.c). After a reboot the
    host's GPUs are probed in PCI order: 0..n-1. Without one, a GPU that stays on nvidia keeps
    its minor (its information file), the boards that leave for vfio-pci free theirs first, and
    the ones that come back take the lowest free minors in PCI order, the order in which
    deploys/vfio.py moves them (to vfio-pci first, then to nvidia)."""
    on_nvidia = [a for a in assignments if a.driver_planned == "nvidia"]
    if rebooting:
        return {a.bdf: rank for rank, a in enumerate(on_nvidia)}
    kept: dict[str, int] = {}
    for a in on_nvidia:
        minor = facts.gpu_information.get(a.bdf, {}).get("Device Minor", "")
        if a.driver_now == "nvidia" and minor.isdigit():
            kept[a.bdf] = int(minor)
    free = (m for m in range(MAX_MINOR) if m not in kept.values())
    return {a.bdf: kept[a.bdf] if a.bdf in kept else next(free) for a in on_nvidia}


def guest_devices(
    assignments: list[GpuAssignment], facts: HostFacts, rebooting: bool = False
) -> tuple[dict[int, tuple[str, ...]], dict[int, tuple[str, ...]]]:
    """Device nodes per container and PCI functions per VM, from the GPU table.

    + rebooting: the run reboots the host, so every host GPU is probed again (planned_minors)
    """
    minors = planned_minors(assignments, facts, rebooting)
    lxc: dict[int, list[str]] = {}
    vm: dict[int, set[str]] = {}
    for a in assignments:
        if a.owner.kind == "lxc" and a.owner.id is not None:
            lxc.setdefault(a.owner.id, []).append(f"/dev/nvidia{minors[a.bdf]}")
        elif a.owner.kind == "vm" and a.owner.id is not None:
            group = facts.iommu_groups.get(a.iommu_group, []) if a.iommu_group is not None else []
            members = {bdf for bdf in group if bdf in facts.pci and not facts.pci[bdf].is_bridge}
            vm.setdefault(a.owner.id, set()).update({a.bdf, *a.functions, *members})
    return (
        {ctid: (*nodes, *LXC_COMMON_NODES) for ctid, nodes in lxc.items()},
        {vmid: tuple(sorted(bdfs)) for vmid, bdfs in vm.items()},
    )
