"""What each VM's config must say for its GPUs: PCI resource mappings and `hostpciN` entries.

Proxmox lets an API token pass a device to a VM only through a cluster PCI mapping
(`/cluster/mapping/pci`, pve-guest-common PVE/Mapping/PCI.pm) and `hostpciN: mapping=<id>`; a raw
`hostpciN: host=...` is root@pam's alone (docs/reference/pve-api.md). So every VM GPU board gets one mapping,
``gpuhost-<domain>-<bus>-<slot>``, whose path is the board without a function (all its functions
pass together, as PCI.pm's assert_valid reads "whole device") and whose id, subsystem-id and
IOMMU group are the live device's, which Proxmox checks again at every start: a board that moved
or was swapped fails the start instead of passing the wrong device.

Entries gpuhost owns are the `hostpciN` whose mapping id starts with ``gpuhost-``; every other
entry is the user's and is left alone, with two exceptions. A raw entry of the same VM that
passes a GPU the spec gives it (the hand-made `hostpci0: 0000:c1:00,pcie=1` gpuhost replaces) is
taken over: its slot gets the mapping entry, through root on the host, since only root@pam may
change a `host=` entry. A raw entry passing a GPU the spec gives to another guest refuses the
plan: one GPU would go to two guests. Pure: reads facts, never the host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.observe.proxmox import GuestConfig
from gpuhost.plan.guests.split import slot

MAPPING_PREFIX = "gpuhost-"
HOSTPCI_SLOTS = 16  # hostpci0..hostpci15 (qemu-server PCI.pm MAX_HOSTPCI_DEVICES)
_HOSTPCI = re.compile(r"hostpci(?P<n>\d{1,2})")
_PCI_ID = re.compile(r"(?:(?P<domain>[0-9a-f]{4,}):)?(?P<bus>[0-9a-f]{2}):(?P<dev>[0-9a-f]{2})")


@dataclass(frozen=True)
class PciMapping:
    """One cluster PCI mapping: a whole GPU board on this node."""

    id: str  # gpuhost-0000-c1-00
    path: str  # 0000:c1:00: the board, every function
    vendor_device: str  # 10de:2bb1
    subsystem_id: str | None  # 10de:204b
    iommu_group: int | None

    def map_entry(self, node: str) -> str:
        """The `map` property string, keys in Proxmox's own (sorted) order."""
        parts = {"id": self.vendor_device, "node": node, "path": self.path}
        if self.iommu_group is not None:
            parts["iommugroup"] = str(self.iommu_group)
        if self.subsystem_id is not None:
            parts["subsystem-id"] = self.subsystem_id
        return ",".join(f"{k}={parts[k]}" for k in sorted(parts))


@dataclass(frozen=True)
class VmGpus:
    """A VM's planned GPU entries against what its config holds now."""

    vmid: int
    name: str
    mappings: tuple[str, ...]  # mapping ids the VM must carry, in BDF order
    hostpci: dict[str, str]  # hostpciN -> value, the owned entries as they must be
    delete: tuple[str, ...]  # owned hostpciN entries to remove
    adopt: dict[str, str] = field(default_factory=dict)  # raw hostpciN (root only) -> its value
    machine: str | None = None  # machine type to set (the spec's), None: leave it
    exists: bool = True

    @property
    def changes(self) -> bool:
        return bool(self.delete or self.hostpci or self.machine)


@dataclass
class VmSplit:
    mappings: dict[str, PciMapping] = field(default_factory=dict)  # every mapping the Plan uses
    vms: dict[int, VmGpus] = field(default_factory=dict)


def mapping_id(bdf: str) -> str:
    """gpuhost-0000-c1-00 for 0000:c1:00.0 (pve-configid: lowercase, digits, '-')."""
    return MAPPING_PREFIX + slot(bdf).replace(":", "-")


def hostpci_value(mapping: str) -> str:
    return f"mapping={mapping},pcie=1"


def _owned(value: str) -> str | None:
    """The mapping id of an entry gpuhost owns, else None."""
    for item in value.split(","):
        key, _, val = item.partition("=")
        if key == "mapping" and val.startswith(MAPPING_PREFIX):
            return val
    return None


def raw_slots(value: str) -> list[str]:
    """The board slots (0000:c1:00) a raw `hostpciN: [host=]ID[;ID]` entry passes."""
    item = value.split(",", 1)[0]
    key, _, ids = item.partition("=")
    if not ids:
        key, ids = "host", key
    if key != "host":
        return []
    found = []
    for pci_id in ids.split(";"):
        m = _PCI_ID.match(pci_id)
        board = f"{m['domain'] or '0000'}:{m['bus']}:{m['dev']}" if m else None
        if board and board not in found:  # functions of one board are one board
            found.append(board)
    return found


def _entries(config: GuestConfig | None) -> dict[str, str]:
    """hostpciN entries as the next start will see them (pending values replace current ones)."""
    if config is None:
        return {}
    entries = {k: v for k, v in config.current.options.items() if _HOSTPCI.fullmatch(k)}
    if config.pending is not None:
        entries.update({k: v for k, v in config.pending.options.items() if _HOSTPCI.fullmatch(k)})
        for key in config.pending.options.get("delete", "").split(","):
            entries.pop(key.strip(), None)
    return entries


def board_mapping(board: str, facts: HostFacts) -> PciMapping | None:
    """The mapping of a board (``0000:c1:00``) as the live device reads; None if not on the bus."""
    dev = facts.pci.get(f"{board}.0")
    if dev is None:
        return None
    subsystem = f"{dev.subsystem_vendor}:{dev.subsystem_device}" if dev.subsystem_vendor else None
    return PciMapping(mapping_id(dev.bdf), board, dev.vendor_device, subsystem, dev.iommu_group)


def plan_vm_gpus(
    vm_functions: dict[int, tuple[str, ...]],
    vm_names: dict[int, str],
    vm_machines: dict[int, str | None],
    gpu_owners: dict[str, str],
    facts: HostFacts,
    problems: list[str],
) -> VmSplit:
    """Mappings and hostpci entries per VM; refuses user entries that pass a planned GPU.

    gpu_owners: board slot -> the owner's description, for every GPU the spec gives a guest.
    """
    split = VmSplit()
    own_boards = {vmid: {slot(b) for b in bdfs} for vmid, bdfs in vm_functions.items()}
    for (kind, vmid), config in sorted(facts.guest_configs.items()):
        if kind != "qemu":
            continue
        for key, value in sorted(_entries(config).items()):
            if _owned(value) is not None:
                continue
            for board in raw_slots(value):
                if board in gpu_owners and board not in own_boards.get(vmid, set()):
                    problems.append(
                        f"vm {vmid} has {key}: {value}, an entry gpuhost does not own, passing GPU "
                        f"{board} that the spec gives to {gpu_owners[board]}; remove it "
                        f"(qm set {vmid} --delete {key}) and let gpuhost pass the GPU through "
                        f"mapping {mapping_id(board + '.0')}"
                    )
    wanted_vms = set(vm_functions) | {
        vmid
        for (kind, vmid), config in facts.guest_configs.items()
        if kind == "qemu" and any(_owned(v) for v in _entries(config).values())
    }
    for vmid in sorted(wanted_vms):
        config = facts.guest_configs.get(("qemu", vmid))
        if config is None:  # nothing to give GPUs to yet (check_vms notes it)
            split.vms[vmid] = VmGpus(vmid, vm_names.get(vmid, ""), (), {}, (), exists=False)
            continue
        boards = sorted({slot(bdf) for bdf in vm_functions.get(vmid, ())})
        wanted: list[str] = []
        for board in boards:
            mapping = board_mapping(board, facts)
            if mapping is None:
                continue
            split.mappings[mapping.id] = mapping
            wanted.append(mapping.id)
        entries = _entries(config)
        have = {key: _owned(value) for key, value in entries.items() if _owned(value)}
        delete = tuple(sorted(k for k, m in have.items() if m not in wanted))
        kept = {m: k for k, m in have.items() if m in wanted}
        adopt: dict[str, str] = {}
        for key, value in sorted(entries.items()):
            boards_here = [b for b in raw_slots(value) if b in boards] if key not in have else []
            if boards_here and mapping_id(boards_here[0] + ".0") not in kept:
                kept[mapping_id(boards_here[0] + ".0")] = key
                adopt[key] = value
        used = set(entries) - set(delete)
        free = (f"hostpci{n}" for n in range(HOSTPCI_SLOTS) if f"hostpci{n}" not in used)
        hostpci: dict[str, str] = {}
        for mid in wanted:
            key = kept.get(mid)
            value = hostpci_value(mid)
            if key is not None and entries[key] == value:
                continue
            key = key or next(free, None)
            if key is None:
                problems.append(
                    f"vm {vmid}: no free hostpciN slot for mapping {mid} (all {HOSTPCI_SLOTS} used)"
                )
                continue
            hostpci[key] = value
        delete = tuple(k for k in delete if k not in hostpci)  # a new value replaces it
        machine = vm_machines.get(vmid)
        current_machine = config.current.options.get("machine")
        split.vms[vmid] = VmGpus(
            vmid=vmid,
            name=vm_names.get(vmid, ""),
            mappings=tuple(wanted),
            hostpci=hostpci,
            delete=delete,
            adopt=adopt,
            machine=machine if machine and machine != current_machine else None,
        )
    return split
