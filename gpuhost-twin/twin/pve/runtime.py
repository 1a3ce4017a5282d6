"""Starting and stopping guests (pct/qm start, stop, exec; the API's status/start|stop), shared
by pct, qm, pvesh and the API (stdlib only). Containers go through the plumbing's supervisor;
VMs are simulated as state only (no QEMU), after PCI passthrough checks.

Modules around it: guest_state (running state, locks, supervisor requests), config_update (pct set,
qm set, pending changes), guest_status (status and lists), tasks (UPIDs).
"""

from __future__ import annotations

import re
from pathlib import Path

from . import config as cfg
from . import options as opts
from .config_update import apply_pending
from .guest_state import (
    is_running,
    set_running,
    supervisor_request,
)
from .schema import (
    FormatError,
    PveError,
    parse_property_string,
)

QEMU_MACHINE_VERSION = "9.2+pve1"


# --- start / stop ---


def start_lxc(root: Path, vmid: int) -> dict[str, object]:
    """vm_start: apply pending changes, then let the supervisor start the real container."""
    cfg.load_config(root, "lxc", vmid)
    if is_running(root, "lxc", vmid):
        raise PveError(f"CT {vmid} already running")
    apply_pending(root, "lxc", vmid)
    return supervisor_request(root, {"op": "ct-start", "ctid": vmid})


def stop_lxc(root: Path, vmid: int) -> dict[str, object]:
    cfg.load_config(root, "lxc", vmid)
    if not is_running(root, "lxc", vmid):
        raise PveError(f"CT {vmid} not running")
    return supervisor_request(root, {"op": "ct-stop", "ctid": vmid})


def exec_lxc(root: Path, vmid: int, argv: list[str], stdin: str | None) -> dict[str, object]:
    cfg.load_config(root, "lxc", vmid)
    if not is_running(root, "lxc", vmid):
        raise PveError(f"container '{vmid}' not running!")
    return supervisor_request(root, {"op": "ct-exec", "ctid": vmid, "argv": argv, "stdin": stdin})


def check_hostpci(root: Path, values: dict[str, str]) -> None:
    """PVE::QemuServer::PCI::parse_hostpci_devices: what `qm start` refuses."""
    machine = values.get("machine", "")
    q35 = "q35" in machine
    seen: set[str] = set()
    for i in range(16):
        value = values.get(f"hostpci{i}")
        if not value:
            continue
        try:
            dev = parse_property_string(opts.HOSTPCI_FMT, value)
        except FormatError as exc:
            raise PveError(f"unable to parse value of 'hostpci{i}' - {exc}") from None
        if "host" in dev and "mapping" in dev:
            raise PveError("Cannot set both 'host' and 'mapping'.")
        if "mapping" in dev:
            raise PveError(f"PCI device mapping not found for '{dev['mapping']}'")
        if "host" not in dev:
            raise PveError("Either 'host' or 'mapping' must be set.")
        devices = root / "sys/bus/pci/devices"
        for pciid in dev["host"].split(";"):
            full = pciid if re.match(r"[a-f0-9]{4,}:[a-f0-9]{2}:", pciid) else f"0000:{pciid}"
            if devices.is_dir():  # the hardware simulation's sysfs; absent in pure tests
                found = sorted(p.name for p in devices.iterdir() if p.name.startswith(full))
                if not found:
                    raise PveError(f"no PCI device found for '{pciid}'")
                for bdf in found:
                    if bdf in seen:
                        raise PveError(f"device '{bdf}' assigned more than once")
                    seen.add(bdf)
        if dev.get("pcie") == "1" and not q35:
            raise PveError("q35 machine model is not enabled")


def running_machine(machine: str) -> str:
    """What `query-machines` would report for a started VM (constructed, QEMU 9.2)."""
    mtype = machine.split(",")[0].removeprefix("type=") if machine else ""
    if re.fullmatch(r"pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?", mtype) or mtype.startswith("pc-q35-"):
        return mtype if "+pve" in mtype else f"{mtype}+pve0"
    base = "pc-q35" if mtype == "q35" else "pc-i440fx"
    return f"{base}-{QEMU_MACHINE_VERSION}"


def start_qemu(root: Path, vmid: int) -> None:
    """qm start, state only: checks what QEMU would refuse, then records the VM as running."""
    cfg.load_config(root, "qemu", vmid)
    if is_running(root, "qemu", vmid):
        raise PveError(f"VM {vmid} already running")
    apply_pending(root, "qemu", vmid)
    conf = cfg.load_config(root, "qemu", vmid)
    check_hostpci(root, conf.main.values)
    machine = running_machine(conf.main.values.get("machine", ""))
    set_running(root, "qemu", vmid, True, pid=_fake_pid(vmid), machine=machine)


def stop_qemu(root: Path, vmid: int) -> None:
    cfg.load_config(root, "qemu", vmid)
    set_running(root, "qemu", vmid, False)  # vm_stop returns quietly when not running


def _fake_pid(vmid: int) -> int:
    return 100000 + vmid % 100000
