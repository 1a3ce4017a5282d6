"""startall / stopall: which guests a node starts at boot and stops at shutdown, and in what order
(stdlib only).

Checked against pve-manager PVE/API2/Nodes.pm (stable-8): `$get_start_stop_list` keeps guests with
`onboot` when autostarting (startall without `force`), every listed guest otherwise (`vms` is a
filter; unknown ids are skipped silently); a guest's `startup` gives its `order`, LONG_MAX when
unset. startall goes through the orders ascending and the vmids ascending within one order,
skips guests already running, waits for each start task, then sleeps `up` seconds (VMs default
to 3, CTs to 0); a failed start is only printed ("Starting CT 101 failed: ...") and the next guest
starts. stopall goes through the orders descending and vmids descending, shuts each running guest
down with `down` // `timeout` (default 180) and force-stop (default 1), and waits for every guest
of an order before the next order. Both run as one task (`startall`/`stopall`) whose failures
inside are warnings, so the task ends OK or `WARNINGS: n`.

Twin differences: the stops of one order run one after another (Proxmox runs up to max_workers in
parallel; the log order within an order is then vmid descending, Proxmox's spawn order); a
container shutdown is the plumbing's stop (no separate clean shutdown is simulated). Every start
and stop is appended to <root>/var/log/gpuhost-twin/guest-power.log (persists across reboots), so
tests can read the order: `<unix time> <start|stop> <lxc|qemu> <vmid> <why>`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import config as cfg
from .guest_state import is_running
from .schema import STARTUP_FMT, FormatError, PveError, parse_property_string, split_list

LONG_MAX = 2**63 - 1  # Perl's POSIX LONG_MAX: guests without an order come last
POWER_LOG = "var/log/gpuhost-twin/guest-power.log"
QEMU_DEFAULT_UP = 3  # startall's "default delay to reduce load" for VMs


@dataclass(frozen=True)
class Entry:
    kind: str  # "lxc" | "qemu"
    vmid: int
    order: int
    up: int | None
    down: int | None


def start_stop_list(root: Path, autostart: bool, vms: str | None = None) -> list[Entry]:
    """$get_start_stop_list, flattened in startall's order (ascending order, then vmid)."""
    wanted = {int(v) for v in split_list(vms)} if vms else None
    entries = []
    for kind in ("lxc", "qemu"):
        for vmid in cfg.guest_ids(root, kind):
            if wanted is not None and vmid not in wanted:
                continue
            try:
                values = cfg.load_config(root, kind, vmid).main.values
                if autostart and values.get("onboot") != "1":
                    continue
                startup = parse_property_string(STARTUP_FMT, values.get("startup", ""))
            except (PveError, FormatError) as exc:
                print(f"warning: {kind} {vmid}: {exc}", flush=True)  # Proxmox warns and skips
                continue
            entries.append(
                Entry(
                    kind,
                    vmid,
                    int(startup["order"]) if "order" in startup else LONG_MAX,
                    int(startup["up"]) if "up" in startup else None,
                    int(startup["down"]) if "down" in startup else None,
                )
            )
    return sorted(entries, key=lambda e: (e.order, e.vmid))


def stop_sequence(entries: list[Entry]) -> list[Entry]:
    """stopall's order: orders descending, vmids descending within one order."""
    return sorted(entries, key=lambda e: (e.order, e.vmid), reverse=True)


def log_power(root: Path, action: str, kind: str, vmid: int, why: str) -> None:
    path = root / POWER_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as log:
        log.write(f"{int(time.time())} {action} {kind} {vmid} {why}\n")


Starter = Callable[[Path, str, int], "str | None"]  # (root, kind, vmid) -> error or None


def startall(
    root: Path, start: Starter, force: bool = False, vms: str | None = None, why: str = "startall"
) -> list[str]:
    """Start the guests startall would, in its order; returns its warnings (one per failure)."""
    warnings = []
    for entry in start_stop_list(root, autostart=not force, vms=vms):
        if is_running(root, entry.kind, entry.vmid):
            continue
        error = start(root, entry.kind, entry.vmid)
        word = "CT" if entry.kind == "lxc" else "VM"
        if error is not None:
            warnings.append(f"Starting {word} {entry.vmid} failed: {error.strip()}")
            continue
        log_power(root, "start", entry.kind, entry.vmid, why)
        delay = (
            entry.up if entry.up is not None else (QEMU_DEFAULT_UP if entry.kind == "qemu" else 0)
        )
        time.sleep(delay)
    return warnings


def stopall(root: Path, stop: Starter, vms: str | None = None, why: str = "stopall") -> list[str]:
    """Stop the running guests stopall would (all, or those in ``vms``), in its order."""
    warnings = []
    for entry in stop_sequence(start_stop_list(root, autostart=False, vms=vms)):
        if not is_running(root, entry.kind, entry.vmid):
            continue
        error = stop(root, entry.kind, entry.vmid)
        if error is not None:
            word = "CT" if entry.kind == "lxc" else "VM"
            warnings.append(f"Stopping {word} {entry.vmid} failed: {error.strip()}")
            continue
        log_power(root, "stop", entry.kind, entry.vmid, why)
    return warnings
