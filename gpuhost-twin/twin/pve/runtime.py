"""Guest state and the operations pct, qm, pvesh and the API share (stdlib only).

Config changes follow pve-container update_pct_config / vmconfig_hotplug_pending /
vmconfig_apply_pending and qemu-server's update_vm_api: every change first goes to the pending
section, then is applied at once when the guest is stopped (or for options that can change live),
otherwise it stays pending until the next start.

Running state:
- containers: <root>/run/gpuhost-twin/ct/<ctid>.json, written by the plumbing's supervisor when it
  starts a guest ({"status": "running", ...}) and removed when it stops; /run is fresh every boot.
- VMs (simulated as state only, no QEMU): <root>/run/gpuhost-twin/qemu/<vmid>.json.
Container start/stop/exec go to the supervisor through <root>/run/gpuhost-twin/requests
(the protocol of twin/shims/twinreq.py, re-implemented here so it honours a root prefix).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import config as cfg
from . import lxc_devices
from . import options as opts
from .schema import (
    FormatError,
    ParamError,
    Prop,
    PveError,
    parse_property_string,
    parse_size,
    split_list,
    validate,
    verify_configid_list,
)

RUN = "run/gpuhost-twin"
# pve-container $LXC_FASTPLUG_OPTIONS: applied at once even while the guest runs
LXC_FASTPLUG = {"description", "onboot", "startup", "protection", "hostname", "hookscript",
                "cores", "tags", "lock"}  # fmt: skip
LXC_HOTPLUG = {"cpulimit", "cpuunits", "memory", "swap"}  # cgroup changes on a live CT
QEMU_FASTPLUG = {"name", "onboot", "shares", "startup", "description", "protection",
                 "vmstatestorage", "hookscript", "tags", "lock"}  # fmt: skip
# formats.md §1: on PVE 8 a devN set on a running CT waits in [pve:pending] for the next start
# (pve-container master hotplugs new devN; the twin follows the PVE 8 behaviour).
HOTPLUG_NEW_LXC_DEVICES = False
# Versions the twin reports (constructed: a PVE 8.4 host runs QEMU 9.2).
PVE_VERSION = {"version": "8.4.1", "release": "8.4", "repoid": "2a5fa54a8503f96d"}
QEMU_VERSION = "9.2.0"
QEMU_MACHINE_VERSION = "9.2+pve1"

COMMON_UPDATE = {
    "delete": Prop(format=verify_configid_list),
    "revert": Prop(format=verify_configid_list),
    "digest": Prop(max_length=64),
}
LXC_UPDATE_SCHEMA: dict[str, Prop] = {
    **{k: v for k, v in opts.LXC_OPTIONS.items() if k not in opts.SNAPSHOT_ONLY},
    **COMMON_UPDATE,
}
QEMU_UPDATE_SCHEMA: dict[str, Prop] = {
    **{k: v for k, v in opts.QEMU_OPTIONS.items() if k not in opts.SNAPSHOT_ONLY},
    **COMMON_UPDATE,
    "skiplock": Prop(type="boolean"),
    "force": Prop(type="boolean"),
    "background_delay": Prop(type="integer", minimum=1, maximum=30),
}


def guest_word(kind: str) -> str:
    return "CT" if kind == "lxc" else "VM"


# --- locking and running state ---


@contextlib.contextmanager
def config_lock(root: Path, kind: str, vmid: int) -> Iterator[None]:
    """flock like PVE::AbstractConfig::lock_config (one writer per guest)."""
    lockdir = root / ("run/lock/lxc" if kind == "lxc" else "run/lock/qemu-server")
    lockdir.mkdir(parents=True, exist_ok=True)
    name = f"pve-config-{vmid}.lock" if kind == "lxc" else f"lock-{vmid}.conf"
    with open(lockdir / name, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def state_path(root: Path, kind: str, vmid: int) -> Path:
    return root / RUN / ("ct" if kind == "lxc" else "qemu") / f"{vmid}.json"


def running_state(root: Path, kind: str, vmid: int) -> dict[str, object] | None:
    try:
        state = json.loads(state_path(root, kind, vmid).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return state if state.get("status") == "running" else None


def is_running(root: Path, kind: str, vmid: int) -> bool:
    return running_state(root, kind, vmid) is not None


def set_running(root: Path, kind: str, vmid: int, running: bool, **extra: object) -> None:
    """Record a guest as running/stopped (the supervisor does this for real containers)."""
    path = state_path(root, kind, vmid)
    if not running:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"status": "running", "started": int(time.time()), **extra}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, path)


# --- the supervisor (outside the chroot) ---


def supervisor_timeout() -> float:
    return float(os.environ.get("TWIN_SUPERVISOR_TIMEOUT", "120"))


def supervisor_request(root: Path, request: dict[str, object]) -> dict[str, object]:
    """Send one request to the twin's supervisor; fail clearly when none answers."""
    requests = root / RUN / "requests"
    where = "/" + str(requests.relative_to(root))
    if not requests.is_dir():
        raise PveError(f"twin: no supervisor serves {where} (is this twin running?)")
    rid = uuid.uuid4().hex
    tmp = requests / f".{rid}.tmp"
    tmp.write_text(json.dumps(request))
    os.rename(tmp, requests / f"{rid}.json")  # atomic: the supervisor never sees half a request
    done = requests / f"{rid}.done"
    deadline = time.monotonic() + supervisor_timeout()
    while time.monotonic() < deadline:
        try:
            answer = json.loads(done.read_text())
        except (FileNotFoundError, ValueError):
            time.sleep(0.02)
            continue
        done.unlink(missing_ok=True)
        return dict(answer)
    (requests / f"{rid}.json").unlink(missing_ok=True)
    raise PveError(
        f"twin: the supervisor did not answer '{request.get('op')}' within "
        f"{supervisor_timeout():g} s ({where})"
    )


# --- config updates (pct set / qm set / PUT .../config) ---


@dataclass
class UpdateResult:
    stdout: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _cleanup_pending(conf: cfg.GuestConfig) -> None:
    """AbstractConfig::cleanup_pending: drop pending values equal to current ones."""
    deletes = cfg.pending_delete(conf)
    for key in list(conf.pending.values):
        if key == "delete":
            continue
        if conf.main.values.get(key) == conf.pending.values[key] or key in deletes:
            del conf.pending.values[key]
    cfg.set_pending_delete(conf, {k: f for k, f in deletes.items() if k in conf.main.values})


def _apply(conf: cfg.GuestConfig, keys: set[str] | None) -> None:
    """vmconfig_apply_pending for `keys` (None: everything)."""
    deletes = cfg.pending_delete(conf)
    for key in list(deletes):
        if keys is None or key in keys:
            conf.main.values.pop(key, None)
            del deletes[key]
    cfg.set_pending_delete(conf, deletes)
    for key in list(conf.pending.values):
        if key != "delete" and (keys is None or key in keys):
            conf.main.values[key] = conf.pending.values.pop(key)


def apply_pending(root: Path, kind: str, vmid: int) -> None:
    """What a start does first: apply every pending change (vm_start)."""
    with config_lock(root, kind, vmid):
        conf = cfg.load_config(root, kind, vmid)
        if conf.pending.values:
            _apply(conf, None)
            cfg.save_config(root, conf)


def _check_delete_list(schema_opts: dict[str, Prop], params: dict[str, str], deletes: list[str],
                       reverts: list[str]) -> None:  # fmt: skip
    for opt in reverts:
        if opt not in schema_opts:
            raise ParamError({"revert": f"unknown option '{opt}'"})
        if opt in params:
            raise ParamError(
                {"delete": f"you can't use '-{opt}' and -revert {opt}' at the same time"}
            )
    for opt in deletes:
        if opt in params:
            raise ParamError(
                {"delete": f"you can't use '-{opt}' and -delete {opt}' at the same time"}
            )
        if opt in reverts:
            raise ParamError(
                {"revert": f"you can't use '-delete {opt}' and -revert {opt}' at the same time"}
            )
        if opt not in schema_opts:
            raise ParamError({"delete": f"unknown option '{opt}'"})


def _device_mode_and_rdev(root: Path, path: str) -> None:
    """PVE::LXC::Tools::get_device_mode_and_rdev: the node must exist on the host now."""
    import stat as st

    try:
        mode = os.stat(root / path.lstrip("/")).st_mode
    except FileNotFoundError:
        raise PveError(f"Device {path} does not exist") from None
    if not (st.S_ISCHR(mode) or st.S_ISBLK(mode)):
        raise PveError(f"{path} is not a device")


def update_lxc(root: Path, vmid: int, params: dict[str, str]) -> UpdateResult:
    """PUT /nodes/{node}/lxc/{vmid}/config (pct set)."""
    params = dict(params)
    validate(params, LXC_UPDATE_SCHEMA)
    digest = params.pop("digest", None)
    deletes = split_list(params.pop("delete", ""))
    reverts = split_list(params.pop("revert", ""))
    if not deletes and not reverts and not params:
        raise PveError("no options specified")
    _check_delete_list(opts.LXC_OPTIONS, params, deletes, reverts)
    result = UpdateResult()
    with config_lock(root, "lxc", vmid):
        conf = cfg.load_config(root, "lxc", vmid)
        _check_lock_and_digest(conf, digest)
        running = is_running(root, "lxc", vmid)
        pend = cfg.pending_delete(conf)
        for opt in reverts:
            conf.pending.values.pop(opt, None)
            pend.pop(opt, None)
        for opt in deletes:
            if (
                opt not in conf.main.values
                and opt not in conf.pending.values
                and not (opt == "description" and conf.main.description is not None)
            ):
                result.warnings.append(f"cannot delete '{opt}' - not set in current configuration!")
                continue
            if opt in ("memory", "rootfs", "ostype"):
                raise PveError(f"unable to delete required option '{opt}'")
            if opt == "unprivileged":
                raise PveError(f"unable to delete read-only option: '{opt}'")
            if opt == "description":
                conf.main.description = None
                continue
            pend[opt] = False
        cfg.set_pending_delete(conf, pend)
        for opt in sorted(params):
            value = params[opt]
            if opt == "unprivileged":
                raise PveError(f"unable to modify read-only option: '{opt}'")
            if re.fullmatch(r"dev\d+", opt):
                device = lxc_devices.parse_device(value)
                _device_mode_and_rdev(root, device.path)
            if opt == "description":
                conf.main.description = value  # a fast-plug option: always applied at once
                continue
            conf.pending.values[opt] = value
            pend = cfg.pending_delete(conf)
            pend.pop(opt, None)
            cfg.set_pending_delete(conf, pend)
        _cleanup_pending(conf)
        if running:
            # what vmconfig_hotplug_pending changes on a live CT; the rest waits for a restart
            live = (
                LXC_FASTPLUG | LXC_HOTPLUG | {k for k in [*params, *deletes] if k.startswith("net")}
            )
            if HOTPLUG_NEW_LXC_DEVICES:
                live |= {k for k in params if k.startswith("dev") and k not in conf.main.values}
            _apply(conf, live)
        else:
            _apply(conf, None)
        cfg.save_config(root, conf)
    return result


def update_qemu(root: Path, vmid: int, params: dict[str, str]) -> UpdateResult:
    """PUT /nodes/{node}/qemu/{vmid}/config (qm set): prints 'update VM <id>: ...'."""
    params = dict(params)
    validate(params, QEMU_UPDATE_SCHEMA)
    paramarr = []
    for key in sorted(params):
        value = "<hidden>" if key == "cipassword" else params[key]
        paramarr += [f"-{key}", value]
    digest = params.pop("digest", None)
    skiplock = params.pop("skiplock", None) == "1"
    params.pop("force", None)
    params.pop("background_delay", None)
    deletes = ["ide2" if d == "cdrom" else d for d in split_list(params.pop("delete", ""))]
    reverts = split_list(params.pop("revert", ""))
    if "cdrom" in params:
        params["ide2"] = params.pop("cdrom")
    if not deletes and not reverts and not params:
        raise PveError("no options specified")
    _check_delete_list(opts.QEMU_OPTIONS, params, deletes, reverts)
    result = UpdateResult()
    with config_lock(root, "qemu", vmid):
        conf = cfg.load_config(root, "qemu", vmid)
        _check_lock_and_digest(conf, digest, skiplock)
        result.stdout.append(f"update VM {vmid}: " + " ".join(paramarr))
        running = is_running(root, "qemu", vmid)
        pend = cfg.pending_delete(conf)
        for opt in reverts:
            if opt in conf.main.values:
                params[opt] = conf.main.values[opt]
            elif opt in conf.pending.values:
                deletes.append(opt)
        for opt in deletes:
            if (
                opt not in conf.main.values
                and opt not in conf.pending.values
                and not (opt == "description" and conf.main.description is not None)
            ):
                result.warnings.append(f"cannot delete '{opt}' - not set in current configuration!")
                continue
            conf.pending.values.pop(opt, None)
            if opt == "description":
                conf.main.description = None
            elif opt in ("tags",) or opt.startswith("unused"):
                conf.main.values.pop(opt, None)
            else:
                pend[opt] = False
        cfg.set_pending_delete(conf, pend)
        for opt, value in params.items():
            if opt == "description":
                conf.main.description = value
                continue
            conf.pending.values[opt] = value
            pend = cfg.pending_delete(conf)
            pend.pop(opt, None)
            cfg.set_pending_delete(conf, pend)
        _cleanup_pending(conf)
        _apply(conf, QEMU_FASTPLUG if running else None)
        cfg.save_config(root, conf)
    return result


def _check_lock_and_digest(conf: cfg.GuestConfig, digest: str | None, skip: bool = False) -> None:
    lock = conf.main.values.get("lock")
    if lock and not skip:
        raise PveError(f"{guest_word(conf.kind)} is locked ({lock})")
    if digest and digest != conf.digest:
        raise PveError("detected modified configuration - file changed by other user? Try again.")


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
            d["running-machine"] = state.get("machine", running_machine(""))
            d["running-qemu"] = QEMU_VERSION
    return d


def list_guests(root: Path, kind: str, full: bool = False) -> list[dict[str, object]]:
    ids = cfg.guest_ids(root, kind)
    if kind == "lxc":
        return [lxc_status(root, i) for i in ids]
    return [qemu_status(root, i, full) for i in ids]


# --- tasks (asynchronous API calls answer with a UPID) ---


def new_upid(root: Path, task_type: str, vmid: int | str, user: str = "root@pam") -> str:
    pid = os.getpid()
    now = int(time.time())
    pstart = int(time.monotonic() * 100) & 0xFFFFFFFF
    return f"UPID:{cfg.node_name(root)}:{pid:08X}:{pstart:08X}:{now:08X}:{task_type}:{vmid}:{user}:"


def record_task(root: Path, upid: str, error: str | None) -> None:
    _, node, pid, pstart, start, ttype, tid, user, _ = upid.split(":")
    task = {
        "upid": upid,
        "node": node,
        "pid": int(pid, 16),
        "pstart": int(pstart, 16),
        "starttime": int(start, 16),
        "endtime": int(time.time()),
        "type": ttype,
        "id": tid,
        "user": user,
        "status": "stopped",
        "exitstatus": "OK" if error is None else error.strip().splitlines()[-1],
    }
    tasks = root / RUN / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    (tasks / f"{_task_key(upid)}.json").write_text(json.dumps(task) + "\n")


def task_status(root: Path, upid: str) -> dict[str, object]:
    try:
        return dict(json.loads((root / RUN / "tasks" / f"{_task_key(upid)}.json").read_text()))
    except FileNotFoundError:
        raise PveError(f"no such task '{upid}'") from None


def _task_key(upid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", upid)
