"""PCI passthrough at VM start and stop, as qemu-server 8.4 does it (stdlib only).

Sources: qemu-server PVE/QemuServer/PCI.pm (parse_hostpci, parse_hostpci_devices,
choose_hostpci_devices, prepare_pci_device, reserve_pci_usage, remove_pci_reservation) and
PVE/QemuServer.pm (vm_start_nolock, cleanup_pci_devices); what they ask of sysfs is
sysfstools.py. What start does to the host, in order:
  1. parse every hostpciN: `mapping=` is resolved for this node from /etc/pve/mapping/pci.cfg and
     checked against the live device (mapping.assert_valid); each id must exist in sysfs; pcie=1
     needs a q35 machine (the die without newline gets Perl's " at ... line 501." suffix);
  2. reserve every function in /run/qemu-server/pci-id-reservations ("PCI device 'X' already in
     use by VMID 'N'" while that VM runs);
  3. per function: "cannot prepare PCI pass-through, IOMMU not present" unless the IOMMU is on;
     then the whole IOMMU group (bridges skipped) goes to vfio-pci (sysfstools.py: new_id,
     unbind, bind; an unbind from nvidia waits while the GPU is held open). qemu-server never
     gives a device back to its old driver at stop.
The twin's VM does not run QEMU: after these steps it is recorded as running (state only).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import config as cfg
from . import mapping
from . import options as opts
from .guest_state import running_state
from .schema import FormatError, PveError, parse_property_string
from .sysfstools import (
    PCIRE,
    PciDev,
    bind_group_to_vfio,
    device_info,
    iommu_present,
    lspci,
    simulation,
)

RESERVATIONS = "run/qemu-server/pci-id-reservations"
PCI_PM = "/usr/share/perl5/PVE/QemuServer/PCI.pm"
MAX_HOSTPCI = 16


@dataclass
class HostPci:
    opt: str
    values: dict[str, str]
    alternatives: list[list[PciDev]] = field(default_factory=list)
    ids: list[PciDev] = field(default_factory=list)  # the chosen alternative


def parse_hostpci(root: Path, opt: str, value: str) -> HostPci:
    """PCI.pm parse_hostpci."""
    try:
        res = parse_property_string(opts.HOSTPCI_FMT, value)
    except FormatError as exc:
        raise PveError(f"unable to parse value of '{opt}' - {exc}") from None
    host, name = res.pop("host", None), res.pop("mapping", None)
    if host is not None and name is not None:
        raise PveError("Cannot set both 'host' and 'mapping'.")
    alternatives: list[list[str]] = []
    if name:
        entries = mapping.find_on_node(root, name, cfg.node_name(root))
        if not entries:
            raise PveError(f"PCI device mapping not found for '{name}'")
        cluster = mapping.load(root).get(name, {})
        for entry in entries:
            try:
                mapping.assert_valid(root, name, entry, cluster)
            except PveError as exc:
                raise PveError(
                    f"PCI device mapping invalid (hardware probably changed): {exc.msg}\n"
                ) from None
            alternatives.append(entry["path"].split(";"))
    elif host:
        alternatives.append(host.split(";"))
    else:
        raise PveError("Either 'host' or 'mapping' must be set.")
    parsed = HostPci(opt, res)
    for alternative in alternatives:
        ids: list[PciDev] = []
        for pciid in alternative:
            devs = lspci(root, pciid)
            if not devs:
                raise PveError(f"no PCI device found for '{pciid}'")
            ids += devs
        if len(ids) > 1 and res.get("mdev"):
            raise PveError("cannot use mediated device with multifunction device")
        parsed.alternatives.append(ids)
    return parsed


def parse_hostpci_devices(root: Path, values: dict[str, str]) -> dict[str, HostPci]:
    """PCI.pm parse_hostpci_devices: q35 is checked here, before anything is reserved."""
    machine = values.get("machine", "")
    q35 = "q35" in machine.split(",")[0]
    devices = {}
    for i in range(MAX_HOSTPCI):
        opt = f"hostpci{i}"
        if not values.get(opt):
            continue
        d = parse_hostpci(root, opt, values[opt])
        if not q35 and d.values.get("pcie") == "1":
            # a die without "\n": Perl appends where it died
            raise PveError(f"q35 machine model is not enabled at {PCI_PM} line 501.")
        devices[opt] = d
    return devices


# --- reservations (PCI.pm reserve_pci_usage / remove_pci_reservation) ---


def _reservations(root: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    try:
        lines = (root / RESERVATIONS).read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        m = re.fullmatch(rf"({PCIRE})\s(\d+)\s(time|pid):(\d+)", line)
        if m:
            out[m.group(1)] = {"vmid": int(m.group(2)), m.group(3): int(m.group(4))}
    return out


def _write_reservations(root: Path, res: dict[str, dict[str, int]]) -> None:
    path = root / RESERVATIONS
    path.parent.mkdir(parents=True, exist_ok=True)
    text = ""
    for pciid in sorted(res):
        r = res[pciid]
        text += f"{pciid} {r['vmid']} " + (f"pid:{r['pid']}" if "pid" in r else f"time:{r['time']}")
        text += "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _vm_pid(root: Path, vmid: int) -> int | None:
    state = running_state(root, "qemu", vmid)
    pid = state.get("pid") if state else None
    return pid if isinstance(pid, int) else None


def reserve(root: Path, ids: list[str], vmid: int, timeout: int | None, pid: int | None,
            warn: Callable[[str], None]) -> None:  # fmt: skip
    """reserve_pci_usage: a time-limited reservation before start, the PID once running."""
    with simulation().locked(root):
        res = _reservations(root)
        now = int(time.time())
        for pciid in ids:
            r = res.get(pciid)
            if r and r["vmid"] != vmid:
                if "time" in r and r["time"] > now:
                    raise PveError(
                        f"PCI device '{pciid}' is currently reserved for use by VMID '{r['vmid']}'"
                    )
                if "pid" in r:
                    if _vm_pid(root, r["vmid"]) == r["pid"]:
                        raise PveError(f"PCI device '{pciid}' already in use by VMID '{r['vmid']}'")
                    warn(f"leftover PCI reservation found for {pciid}, lets take it...")
            res[pciid] = {"vmid": vmid}
            if pid is not None:
                res[pciid]["pid"] = pid
            elif timeout is not None:
                res[pciid]["time"] = now + timeout + 5
        _write_reservations(root, res)


def remove_reservation(root: Path, vmid: int) -> None:
    """cleanup_pci_devices → remove_pci_reservation($vmid): at stop, or when start failed."""
    with simulation().locked(root):
        res = _reservations(root)
        _write_reservations(root, {k: v for k, v in res.items() if v["vmid"] != vmid})


def start_devices(root: Path, vmid: int, values: dict[str, str],
                  warn: Callable[[str], None], log: Callable[[str], None]) -> list[str]:  # fmt: skip
    """vm_start_nolock's PCI part: parse, choose, reserve, prepare. Returns the reserved ids."""
    devices = parse_hostpci_devices(root, values)
    used: set[str] = set()
    for opt in sorted(devices, key=lambda k: int(k[7:])):
        d = devices[opt]
        d.ids = d.alternatives[0]
        if len(d.alternatives) > 1:  # the first alternative nobody uses or reserved
            res = _reservations(root)
            free = [
                alt for alt in d.alternatives
                if not any(p.id in used or (p.id in res and res[p.id]["vmid"] != vmid
                                            and _vm_pid(root, res[p.id]["vmid"]) is not None)
                           for p in alt)
            ]  # fmt: skip
            if not free:
                raise PveError(f"could not find a free device for '{opt}'")
            d.ids = free[0]
        for p in d.ids:
            if p.id in used:
                raise PveError(f"device '{p.id}' assigned more than once")
            used.add(p.id)
    ids = [p.id for d in devices.values() for p in d.ids]
    reserve(root, ids, vmid, timeout=30, pid=None, warn=warn)
    try:
        for opt in sorted(devices):
            for p in devices[opt].ids:  # prepare_pci_device
                info = device_info(root, p.id)
                if not iommu_present(root):
                    raise PveError("cannot prepare PCI pass-through, IOMMU not present")
                if info is None:
                    raise PveError(f"no pci device info for device '{p.id}'")
                if not devices[opt].values.get("mdev"):
                    bind_group_to_vfio(root, p.id, log)
    except PveError:
        remove_reservation(root, vmid)
        raise
    return ids
