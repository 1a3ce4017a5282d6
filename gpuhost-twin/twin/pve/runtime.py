"""Starting and stopping guests (pct/qm start, stop, exec; the API's status/start|stop), shared
by pct, qm, pvesh and the API (stdlib only). Containers go through the plumbing's supervisor;
VMs are simulated as state only (no QEMU), after PCI passthrough checks.

Modules around it: guest_state (running state, locks, supervisor requests), config_update (pct set,
qm set, pending changes), guest_status (status and lists), tasks (UPIDs).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from . import config as cfg
from . import hookscript, passthrough
from .config_update import apply_pending, assert_valid_machine
from .guest_state import (
    is_running,
    set_running,
    supervisor_request,
)
from .schema import PveError

# The machine version an unversioned type runs as: QEMU's newest, with qemu-server's highest
# +pveN for it (Machine.pm $PVE_MACHINE_VERSION: '9.2' => 1; 9.0.21 has no '10.0' entry, so 0).
QEMU_MACHINE_VERSIONS = {8: "9.2+pve1", 9: "10.0+pve0"}


# --- start / stop ---


def start_lxc(
    root: Path,
    vmid: int,
    log: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
    start: Callable[[], dict[str, object]] | None = None,
) -> dict[str, object]:
    """vm_start: apply pending changes, run the hookscript's pre-start (its failure aborts the
    start: pve-container PVE/LXC.pm vm_start, stop_on_error), let the supervisor start the real
    container (``start``: the supervisor's own start, when it is the caller), then post-start."""
    cfg.load_config(root, "lxc", vmid)
    if is_running(root, "lxc", vmid):
        raise PveError(f"CT {vmid} already running")
    apply_pending(root, "lxc", vmid)
    values = cfg.load_config(root, "lxc", vmid).main.values
    hookscript.run(root, values, vmid, "pre-start", stop_on_error=True, log=log)
    answer = start() if start else supervisor_request(root, {"op": "ct-start", "ctid": vmid})
    if answer.get("rc") == 0:
        hookscript.run(root, values, vmid, "post-start", log=log, warn=warn)
    return answer


def stop_lxc(root: Path, vmid: int, log: Callable[[str], None] | None = None) -> dict[str, object]:
    """vm_stop: pre-stop, the stop, then post-stop (lxc-pve-poststop-hook; see hookscript.py)."""
    values = cfg.load_config(root, "lxc", vmid).main.values
    if not is_running(root, "lxc", vmid):
        raise PveError(f"CT {vmid} not running")
    hookscript.run(root, values, vmid, "pre-stop", log=log)
    answer = supervisor_request(root, {"op": "ct-stop", "ctid": vmid})
    if answer.get("rc") == 0:
        hookscript.run(root, values, vmid, "post-stop", log=log)
    return answer


def exec_lxc(root: Path, vmid: int, argv: list[str], stdin: str | None) -> dict[str, object]:
    cfg.load_config(root, "lxc", vmid)
    if not is_running(root, "lxc", vmid):
        raise PveError(f"container '{vmid}' not running!")
    return supervisor_request(root, {"op": "ct-exec", "ctid": vmid, "argv": argv, "stdin": stdin})


def running_machine(machine: str, release: int = 8) -> str:
    """What `query-machines` would report for a started VM (constructed; QEMU 9.2 on PVE 8,
    10.0 on PVE 9)."""
    mtype = machine.split(",")[0].removeprefix("type=") if machine else ""
    if re.fullmatch(r"pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?", mtype) or mtype.startswith("pc-q35-"):
        return mtype if "+pve" in mtype else f"{mtype}+pve0"
    base = "pc-q35" if mtype == "q35" else "pc-i440fx"
    return f"{base}-{QEMU_MACHINE_VERSIONS[release]}"


def start_qemu(
    root: Path,
    vmid: int,
    skiplock: bool = False,
    warn: Callable[[str], None] | None = None,
    log: Callable[[str], None] | None = None,
    hook_log: Callable[[str], None] | None = None,
) -> None:
    """QemuServer::vm_start, state only: the config checks and the host's PCI passthrough work
    (passthrough.py) that qemu-server does, then the VM is recorded as running (no QEMU)."""
    hook_log = hook_log or log  # the hookscript's output (qm start prints it)
    warn = warn or (lambda _msg: None)
    log = log or (lambda _msg: None)
    conf = cfg.load_config(root, "qemu", vmid)
    if conf.main.values.get("template") == "1":
        raise PveError("you can't start a vm if it's a template")
    lock = conf.main.values.get("lock")
    if lock and not skiplock:
        raise PveError(f"VM is locked ({lock})")
    if is_running(root, "qemu", vmid):
        raise PveError(f"VM {vmid} already running")
    apply_pending(root, "qemu", vmid)
    conf = cfg.load_config(root, "qemu", vmid)
    assert_valid_machine(conf.main.values.get("machine", ""))
    # qemu-server QemuServer.pm vm_start: pre-start with stop_on_error, before the devices
    hookscript.run(root, conf.main.values, vmid, "pre-start", stop_on_error=True, log=hook_log)
    ids = passthrough.start_devices(root, vmid, conf.main.values, warn, log)
    machine = running_machine(conf.main.values.get("machine", ""), cfg.pve_release(root))
    set_running(root, "qemu", vmid, True, pid=_fake_pid(vmid), machine=machine)
    passthrough.reserve(root, ids, vmid, timeout=None, pid=_fake_pid(vmid), warn=warn)
    hookscript.run(root, conf.main.values, vmid, "post-start", log=hook_log, warn=warn)


def stop_qemu(root: Path, vmid: int, skiplock: bool = False) -> None:
    """vm_stop: quiet when not running; a lock refuses; vm_stop_cleanup releases the PCI
    reservations and applies pending changes (the devices stay bound to vfio-pci)."""
    conf = cfg.load_config(root, "qemu", vmid)
    if not is_running(root, "qemu", vmid):
        return
    lock = conf.main.values.get("lock")
    if lock and not skiplock:
        raise PveError(f"VM is locked ({lock})")
    hookscript.run(root, conf.main.values, vmid, "pre-stop")  # _do_vm_stop
    set_running(root, "qemu", vmid, False)
    passthrough.remove_reservation(root, vmid)
    apply_pending(root, "qemu", vmid)
    hookscript.run(root, conf.main.values, vmid, "post-stop")  # vm_stop_cleanup


def _fake_pid(vmid: int) -> int:
    return 100000 + vmid % 100000
