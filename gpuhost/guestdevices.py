"""The device nodes each GPU container needs and the PCI functions each VM is given, from the
Plan's GPU table (kept apart from plan.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuhost.hostfacts import HostFacts

if TYPE_CHECKING:
    from gpuhost.plan import GpuAssignment

# The nodes every GPU container needs besides its GPUs' own: the control device and UVM
# (CUDA's unified memory; cuInit fails without it).
LXC_COMMON_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


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


def guest_devices(
    assignments: list[GpuAssignment], facts: HostFacts
) -> tuple[dict[int, tuple[str, ...]], dict[int, tuple[str, ...]]]:
    """Device nodes per container and PCI functions per VM, from the GPU table."""
    # The driver numbers GPUs (/dev/nvidiaN) in the order it probes them, which its
    # information file states; a GPU not on nvidia yet gets its rank among those that will be.
    on_nvidia = [a for a in assignments if a.driver_planned == "nvidia"]
    minors: dict[str, str] = {}
    for rank, a in enumerate(on_nvidia):
        info = facts.gpu_information.get(a.bdf, {})
        minors[a.bdf] = info.get("Device Minor", str(rank))
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
