"""Status and lists of guests, as PVE::LXC::vmstatus and PVE::QemuServer::vmstatus report them
(stdlib only)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from . import config as cfg
from .guest_state import (
    running_state,
    state_path,
)
from .runtime import (
    _fake_pid,
    running_machine,
)
from .schema import (
    parse_size,
    split_list,
)

# Versions the twin reports, per Proxmox VE release: GET /version (repoid = pve-manager's
# version-bump commit, 16 hex digits) and the QEMU a VM runs (pve-qemu-kvm's debian/changelog:
# PVE 8.4 has 9.2.0; PVE 9.0 of September 2025 has 10.0.2, 10.1 came in October).
PVE_VERSIONS = {
    8: {"version": "8.4.1", "release": "8.4", "repoid": "2a5fa54a8503f96d"},
    9: {"version": "9.0.10", "release": "9.0", "repoid": "deb1ca707ec72a89"},
}
QEMU_VERSIONS = {8: "9.2.0", 9: "10.0.2"}


# --- status and lists (PVE::LXC::vmstatus, PVE::QemuServer::vmstatus) ---


def host_cpus(root: Path) -> int:
    try:
        count = sum(
            1 for line in (root / "proc/cpuinfo").read_text().splitlines()
            if line.startswith("processor")
        )  # fmt: skip
    except FileNotFoundError:
        count = 0
    return count or os.cpu_count() or 1


def host_uptime(root: Path) -> int:
    try:
        return int(float((root / "proc/uptime").read_text().split()[0]))
    except (FileNotFoundError, ValueError, IndexError):
        return 0


def _uptime_of(root: Path, kind: str, vmid: int, state: dict[str, object] | None) -> int:
    """Seconds since start: the state's "started", else when the state file was written."""
    if not state:
        return 0
    started = state.get("started")
    if not isinstance(started, int | float):
        try:
            started = state_path(root, kind, vmid).stat().st_mtime
        except FileNotFoundError:
            return 0
    return max(0, int(time.time() - started))


def _size_of(volume: str | None) -> int:
    if not volume:
        return 0
    m = re.search(r"(?:^|,)size=([^,]+)", volume)
    return (parse_size(m.group(1)) or 0) if m else 0


def lxc_status(root: Path, vmid: int) -> dict[str, object]:
    values = cfg.load_config(root, "lxc", vmid).main.values
    state = running_state(root, "lxc", vmid)
    d: dict[str, object] = {
        "vmid": vmid,
        "status": "running" if state else "stopped",
        "name": re.sub(r"\s", "", values.get("hostname", f"CT{vmid}")),
        "type": "lxc",
        "cpus": int(values.get("cores") or float(values.get("cpulimit", "0")) or host_cpus(root)),
        "cpu": 0,
        "mem": 0,
        "maxmem": int(values.get("memory", "512")) * 1024 * 1024,
        "swap": 0,
        "maxswap": int(values.get("swap", "512")) * 1024 * 1024,
        "disk": 0,
        "maxdisk": _size_of(values.get("rootfs")),
        "netin": 0,
        "netout": 0,
        "diskread": 0,
        "diskwrite": 0,
        "uptime": _uptime_of(root, "lxc", vmid, state),
    }
    if state and isinstance(state.get("pid"), int):
        d["pid"] = state["pid"]
    for key in ("tags", "lock"):
        if values.get(key):
            d[key] = values[key]
    if values.get("template") == "1":
        d["template"] = 1
    return d


def _bootdisk(values: dict[str, str]) -> str | None:
    boot = values.get("boot", "")
    m = re.search(r"order=([^,]+)", boot)
    candidates = split_list(m.group(1)) if m else []
    if values.get("bootdisk"):
        candidates.append(values["bootdisk"])
    candidates += ["scsi0", "virtio0", "sata0", "ide0"]
    for key in candidates:
        value = values.get(key)
        if value and "media=cdrom" not in value:
            return value
    return None


def qemu_status(root: Path, vmid: int, full: bool = False) -> dict[str, object]:
    values = cfg.load_config(root, "qemu", vmid).main.values
    state = running_state(root, "qemu", vmid)
    memory = values.get("memory", "512")
    m = re.search(r"(?:current=)?(\d+)", memory)
    cpus = int(values.get("sockets", "1")) * int(values.get("cores", "1"))
    cpus = min(cpus, host_cpus(root))
    if values.get("vcpus"):
        cpus = int(values["vcpus"])
    d: dict[str, object] = {
        "vmid": vmid,
        "status": "running" if state else "stopped",
        "name": values.get("name", f"VM {vmid}"),
        "cpus": cpus,
        "cpu": 0,
        "mem": 0,
        "maxmem": int(m.group(1) if m else 512) * 1024 * 1024,
        "disk": 0,
        "maxdisk": _size_of(_bootdisk(values)),
        "netin": 0,
        "netout": 0,
        "diskread": 0,
        "diskwrite": 0,
        "uptime": _uptime_of(root, "qemu", vmid, state),
    }
    if state:
        d["pid"] = state.get("pid", _fake_pid(vmid))
    if any(re.fullmatch(r"serial\d+", k) for k in values):
        d["serial"] = 1
    for key in ("tags", "lock"):
        if values.get(key):
            d[key] = values[key]
    if values.get("template") == "1":
        d["template"] = 1
    if full:
        d["qmpstatus"] = "running" if state else "stopped"
        if state:
            release = cfg.pve_release(root)
            d["running-machine"] = state.get("machine", running_machine("", release))
            d["running-qemu"] = QEMU_VERSIONS[release]
    return d


def list_guests(root: Path, kind: str, full: bool = False) -> list[dict[str, object]]:
    ids = cfg.guest_ids(root, kind)
    if kind == "lxc":
        return [lxc_status(root, i) for i in ids]
    return [qemu_status(root, i, full) for i in ids]
