"""Power actions of guests as task workers: start, stop, shutdown, reboot (stdlib only).

Which checks run before the worker (an HTTP error) and which inside it (a failed task) follows
qemu-server API2/Qemu.pm (vm_start, vm_stop, vm_shutdown, vm_reboot) and pve-container
API2/LXC/Status.pm: the HTTP call fails only for LXC start of a running CT ("CT N already
running"), LXC stop/shutdown/reboot of a stopped CT ("CT N not running"), qemu reboot of a
stopped VM ("VM N not running") and `skiplock`/`keepActive` from anyone but root@pam; a missing
guest, a lock, "VM N already running" and every passthrough error fail the task.

Shutdown of a twin VM: there is no guest OS, so the ACPI powerdown request is honoured at once,
unless a test made the VM ignore it (guest_state.set_acpi_ignored); then the worker waits
`timeout` seconds (default: the startup `down` value, else 60) and, without forceStop, fails with
"VM quit/powerdown failed - got timeout" like QemuServer::_do_vm_stop. Like vm_stop_cleanup, any
stop releases the VM's PCI reservations and applies its pending changes; devices stay on
vfio-pci. A container shutdown is the plumbing's stop (no separate clean shutdown); a container
reboot is a stop and a start.
"""

from __future__ import annotations

import time
from pathlib import Path

from . import access
from . import config as cfg
from . import guest_state as gs
from . import runtime as rt
from .schema import STARTUP_FMT, FormatError, ParamError, PveError, parse_property_string
from .tasks import Worker


def root_only(params: dict[str, str], *names: str) -> None:
    """raise_param_exc({name => "Only root may use this option."}) for anyone but root@pam."""
    for name in names:
        if params.get(name) == "1" and access.caller() != access.ROOT:
            raise ParamError({name: "Only root may use this option."})


def precheck(root: Path, kind: str, action: str, vmid: int) -> None:
    """The checks the API handlers make before they fork the worker."""
    running = gs.is_running(root, kind, vmid)
    if kind == "lxc":
        if action == "start" and running:
            raise PveError(f"CT {vmid} already running")
        if action in ("stop", "shutdown", "reboot") and not running:
            raise PveError(f"CT {vmid} not running")
    elif action == "reboot" and not running:
        raise PveError(f"VM {vmid} not running")


def run(root: Path, kind: str, action: str, vmid: int, params: dict[str, str], w: Worker) -> None:
    """The worker's code: raises PveError with the task's error text."""
    skiplock = params.get("skiplock") == "1"
    timeout = int(params["timeout"]) if params.get("timeout") else None
    force = params.get("forceStop") == "1"
    if kind == "qemu":
        if action == "start":
            rt.start_qemu(root, vmid, skiplock=skiplock, warn=w.warn, log=w.log)
        elif action == "stop":
            rt.stop_qemu(root, vmid, skiplock=skiplock)
        elif action == "shutdown":
            shutdown_qemu(root, vmid, timeout, force, skiplock, w)
        else:  # reboot: a shutdown, then qmeventd starts the VM again
            shutdown_qemu(root, vmid, timeout, False, False, w)
            try:
                rt.start_qemu(root, vmid, warn=w.warn, log=w.log)
            except PveError as exc:
                w.warn(f"restart of VM {vmid} failed: {exc.msg.strip()}")
        return
    if action in ("stop", "shutdown", "reboot"):
        _lxc(rt.stop_lxc(root, vmid, log=w.log), action, vmid)
    if action in ("start", "reboot"):
        _lxc(rt.start_lxc(root, vmid, log=w.log, warn=w.warn), "start", vmid)


def _lxc(answer: dict[str, object], action: str, vmid: int) -> None:
    if answer.get("rc") != 0:
        raise PveError(str(answer.get("stderr") or "") or f"{action} of CT {vmid} failed")


def shutdown_qemu(root: Path, vmid: int, timeout: int | None, force: bool, skiplock: bool,
                  w: Worker) -> None:  # fmt: skip
    """QemuServer::_do_vm_stop with shutdown=1."""
    with gs.config_lock(root, "qemu", vmid):
        state = gs.running_state(root, "qemu", vmid)
        if state is None:
            return
        conf = cfg.load_config(root, "qemu", vmid)
        lock = conf.main.values.get("lock")
        if lock and not skiplock:
            raise PveError(f"VM is locked ({lock})")
        if timeout is None:
            timeout = _startup_down(conf.main.values.get("startup", "")) or 60
    if state.get("acpi_ignored"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and gs.is_running(root, "qemu", vmid):
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        if gs.is_running(root, "qemu", vmid):
            if not force:
                raise PveError("VM quit/powerdown failed - got timeout")
            w.warn("VM still running - terminating now with SIGTERM")
    rt.stop_qemu(root, vmid, skiplock=True)


def _startup_down(text: str) -> int | None:
    try:
        down = parse_property_string(STARTUP_FMT, text).get("down") if text else None
    except FormatError:
        return None
    return int(down) if down else None
