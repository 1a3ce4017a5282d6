"""Which running guests have a GPU board in their config (pure: reads facts only).

A board moved by hand (deploys/rebind_board.py) while a running guest is configured with it
leaves that guest with a device it can no longer use (a container's /dev/nvidiaN now names no
GPU, or another one after the next probe), or takes it from under a VM. The move is refused,
naming the guest, whether or not a process holds the device at that moment.
"""

from __future__ import annotations

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.observe.proxmox import MAPPINGS_FILE, parse_pci_mappings
from gpuhost.plan.guests.containers import dev_path, effective_devs
from gpuhost.plan.guests.split import slot
from gpuhost.plan.guests.vms import raw_slots


def _vm_boards(value: str, mapping_paths: dict[str, set[str]]) -> set[str]:
    """Boards a hostpciN value passes: raw `host=` ids, or a mapping's paths on this node."""
    mapping = next((p.removeprefix("mapping=") for p in value.split(",") if "mapping=" in p), None)
    if mapping is not None:
        return mapping_paths.get(mapping, set())
    return set(raw_slots(value))


def holders(functions: tuple[str, ...], facts: HostFacts) -> list[str]:
    """Each running guest whose config has the board of ``functions`` (the GPU first), as
    "CT 200 (/dev/nvidia2 as dev3)" or "VM 129 (hostpci0)"."""
    statuses = facts.guest_statuses or {}
    board = slot(functions[0])
    minor = facts.gpu_information.get(functions[0], {}).get("Device Minor", "")
    node = f"/dev/nvidia{minor}" if minor.isdigit() else None
    managed = facts.managed
    local = (managed.links.get("/etc/pve/local", "") if managed else "").removeprefix("nodes/")
    mappings = parse_pci_mappings((managed.files.get(MAPPINGS_FILE) or "") if managed else "")
    paths: dict[str, set[str]] = {}
    for mid, config in mappings.items():
        for entry in config.maps:
            fields = dict(p.split("=", 1) for p in entry.split(",") if "=" in p)
            if fields.get("node") == local and "path" in fields:
                paths.setdefault(mid, set()).add(slot(fields["path"] + ".0"))
    found = []
    for (kind, vmid), config in sorted(facts.guest_configs.items()):
        if statuses.get((kind, vmid)) != "running":
            continue
        if kind == "lxc" and node is not None:
            keys = [k for k, v in effective_devs(config).items() if dev_path(v) == node]
            keys += [k for k, v in config.current.raw if v.split(" ", 1)[0] == node]
            if keys:
                found.append(f"CT {vmid} ({node} as {', '.join(keys)})")
        elif kind == "qemu":
            keys = [
                k
                for k, v in sorted(config.current.options.items())
                if k.startswith("hostpci") and board in _vm_boards(v, paths)
            ]
            if keys:
                found.append(f"VM {vmid} ({', '.join(keys)})")
    return found
