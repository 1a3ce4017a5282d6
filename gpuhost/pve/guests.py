"""Guests as inventory: a node's containers and VMs, listed from its Proxmox API, as pyinfra hosts.

    gpu_hosts = [gpu_host("kpro6", spec={...}, ssh_hostname="kpro6.lan")]
    gpu_guests = guests_of(gpu_hosts[0])  # ct200, vm129: `pyinfra inventory/kpro6.py --limit ct200`

The listing runs `pvesh` as root over SSH through proxmoxer (gpuhost/pve/ssh.py), with the host
key verified against the inventory's known_hosts file (or the user's): an inventory is read before pyinfra connects, when there is no
verified TLS anchor for the HTTPS API yet, and the listing needs no API token. Every guest the
node has becomes a host named after the guest, carrying the guest's spec entry (or None for a
guest the spec does not name) under ``gpuhost_guest``; a guest the spec names that the node does
not have is an error, naming it. How a guest is reached: the spec's ``access`` (containers), else
its static address in the config (``net0: ...ip=10.0.0.5/24``, ``ipconfig0: ip=...``), else its
name (DNS).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pyinfra.api.exceptions import InventoryError

from gpuhost.spec.guests import LxcGuest, VmGuest
from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import GUEST_KEY, SOURCE_KEY, SPEC_KEY

_STATIC_IP = re.compile(r"(?:^|,)ip=(?P<ip>[0-9a-fA-F.:]+)/\d+")


@dataclass(frozen=True)
class GuestEntry:
    """What a guest host carries: its node, kind and id, live status, and its spec entry."""

    node_host: str  # the GPU host's inventory name
    kind: str  # "lxc" | "qemu"
    vmid: int
    status: str
    spec: LxcGuest | VmGuest | None

    def to_json(self) -> dict[str, Any]:
        return {
            "node_host": self.node_host,
            "kind": self.kind,
            "vmid": self.vmid,
            "status": self.status,
            "spec": self.spec.model_dump(mode="json") if self.spec else None,
        }


def list_guests(name: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """``[{"kind", "vmid", "name", "status", "config"}]`` from the node's API, as root over SSH."""
    from proxmoxer.core import ResourceException

    from gpuhost.pve.ssh import pve_over_ssh

    spec: HostSpec = data[SPEC_KEY]
    try:
        api = pve_over_ssh(
            str(data.get("ssh_hostname") or name),
            user=str(data.get("ssh_user") or "root"),
            port=int(data.get("ssh_port") or 22),
            known_hosts=data.get("ssh_known_hosts_file"),
            private_key_file=data.get("ssh_key"),
        )
        node = spec.proxmox.node
        if node is None:
            nodes = [n["node"] for n in api.nodes.get()]
            if len(nodes) != 1:
                raise InventoryError(
                    f"{name}: the API lists {len(nodes)} nodes; set proxmox.node in its spec"
                )
            node = nodes[0]
        found = []
        for kind in ("lxc", "qemu"):
            for guest in getattr(api.nodes(node), kind).get():
                vmid = int(guest["vmid"])
                config = getattr(api.nodes(node), kind)(vmid).config.get()
                found.append(
                    {
                        "kind": kind,
                        "vmid": vmid,
                        "name": str(guest.get("name") or config.get("hostname") or vmid),
                        "status": str(guest.get("status", "unknown")),
                        "config": config,
                    }
                )
        return found
    except ResourceException as exc:
        raise InventoryError(f"{name}: listing its guests failed: {exc}") from None
    except Exception as exc:  # ssh failures come as the backend's own errors
        if isinstance(exc, InventoryError):
            raise
        raise InventoryError(
            f"{name}: cannot list its guests over SSH ({type(exc).__name__}: "
            f"{str(exc).strip()[:200]}); check that `ssh root@{data.get('ssh_hostname') or name}` "
            "works with a known host key"
        ) from None


def _address(guest: dict[str, Any], spec: LxcGuest | VmGuest | None) -> tuple[str, dict]:
    if isinstance(spec, LxcGuest) and spec.access.ssh_hostname:
        access = spec.access
        return access.ssh_hostname, {"ssh_user": access.ssh_user, "ssh_port": access.ssh_port}
    config = guest["config"]
    for key in ("net0", "ipconfig0"):
        match = _STATIC_IP.search(str(config.get(key, "")))
        if match:
            return match["ip"], {}
    return guest["name"], {}


def guests_of(
    entry: tuple[str, dict[str, Any]], listed: list[dict[str, Any]] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """Inventory entries for every guest of ``entry``'s node (``listed`` instead of the API)."""
    name, data = entry
    spec: HostSpec = data[SPEC_KEY]
    guests = list_guests(name, data) if listed is None else listed
    by_id = {("lxc" if isinstance(g, LxcGuest) else "qemu", g.guest_id): g for g in spec.guests}
    present = {(g["kind"], g["vmid"]) for g in guests}
    missing = [
        f"{k} {vmid} ({g.name})" for (k, vmid), g in by_id.items() if (k, vmid) not in present
    ]
    if missing:
        raise InventoryError(
            f"{name}: its spec names guests the node does not have: {', '.join(missing)}; create "
            "them, or remove them from the spec"
        )
    entries = []
    for guest in sorted(guests, key=lambda g: (g["kind"], g["vmid"])):
        guest_spec = by_id.get((guest["kind"], guest["vmid"]))
        address, access = _address(guest, guest_spec)
        host_data = {
            key: data[key]
            for key in ("ssh_key", "ssh_known_hosts_file", "ssh_strict_host_key_checking")
            if key in data
        }
        host_data.update({"ssh_hostname": address, "ssh_user": "root", **access})
        host_data[SOURCE_KEY] = data.get(SOURCE_KEY)
        host_data[GUEST_KEY] = GuestEntry(
            name, guest["kind"], guest["vmid"], guest["status"], guest_spec
        )
        entries.append((guest_spec.name if guest_spec else guest["name"], host_data))
    return entries
