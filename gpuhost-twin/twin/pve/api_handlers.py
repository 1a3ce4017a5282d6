"""The handlers of the Proxmox API paths the twin serves (routes.py maps paths to them): version,
nodes, guests' config, pending, status, start/stop, create/delete, task status. Shapes follow
pve-manager/pve-container/qemu-server API2 modules (formats.md §4); handlers return plain data."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import config as cfg
from . import config_update as cu
from . import guest_state as gs
from . import guest_status as gst
from . import options as opts
from . import runtime as rt
from . import startstop, tasks
from .schema import ParamError, Prop, PveError, validate, verify_configid, verify_vmid

Handler = Callable[[Path, dict[str, str], dict[str, str]], "Result"]


@dataclass
class Result:
    data: object = None
    stdout: list[str] = field(default_factory=list)  # what the handler prints (qm's 'update VM')
    warnings: list[str] = field(default_factory=list)  # perl warn(): stderr
    task_error: str | None = None  # an asynchronous task that failed (its UPID is in data)


CREATE_EXTRA: dict[str, dict[str, Prop]] = {
    "lxc": {
        "vmid": Prop(format=verify_vmid, optional=False),
        "ostemplate": Prop(),
        "storage": Prop(format=verify_configid),
        "password": Prop(),
        "ssh-public-keys": Prop(),
        "start": Prop(type="boolean"),
    },
    "qemu": {
        "vmid": Prop(format=verify_vmid, optional=False),
        "storage": Prop(format=verify_configid),
        "start": Prop(type="boolean"),
    },
}


def _node(root: Path, path_params: dict[str, str]) -> None:
    node = path_params.get("node")
    if node is not None and node != cfg.node_name(root) and node != "localhost":
        raise PveError(
            f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
            "Name or service not known"
        )


def _vmid(path_params: dict[str, str]) -> int:
    errors: dict[str, str] = {}
    try:
        verify_vmid(path_params["vmid"])
    except Exception as exc:  # FormatError
        errors["vmid"] = f"invalid format - {exc}"
        raise ParamError(errors) from None
    return int(path_params["vmid"])


# --- typed JSON like the Perl API returns (check_type turned ints/bools into numbers) ---


def typed(kind: str, values: dict[str, str]) -> dict[str, object]:
    options = opts.LXC_OPTIONS if kind == "lxc" else opts.QEMU_OPTIONS
    out: dict[str, object] = {}
    for key, value in values.items():
        prop = options.get(key)
        if (
            prop is not None
            and prop.type in ("integer", "boolean")
            and re.fullmatch(r"-?\d+", value)
        ):
            out[key] = int(value)
        else:
            out[key] = value
    return out


# --- handlers ---


def get_version(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    return Result(dict(gst.PVE_VERSION))


def get_nodes(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    node = cfg.node_name(root)
    return Result(
        [
            {
                "node": node,
                "id": f"node/{node}",
                "type": "node",
                "status": "online",
                "level": "",
                "cpu": 0.01,
                "maxcpu": gst.host_cpus(root),
                "mem": 0,
                "maxmem": _host_mem(root),
                "disk": 0,
                "maxdisk": 0,
                "uptime": gst.host_uptime(root),
            }
        ]
    )


def _host_mem(root: Path) -> int:
    try:
        m = re.search(r"^MemTotal:\s+(\d+) kB", (root / "proc/meminfo").read_text(), re.M)
    except FileNotFoundError:
        m = None
    return int(m.group(1)) * 1024 if m else 0


def get_node_index(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    _node(root, path)
    return Result([{"name": n} for n in ("lxc", "qemu", "tasks", "version")])


def list_guests(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        _node(root, path)
        return Result(gst.list_guests(root, kind, full=params.get("full") == "1"))

    return handler


def guest_index(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        _node(root, path)
        cfg.load_config(root, kind, _vmid(path))
        return Result([{"subdir": s} for s in ("config", "pending", "status")])

    return handler


def get_config(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        _node(root, path)
        vmid = _vmid(path)
        conf = cfg.load_config(root, kind, vmid)
        snapname = params.get("snapshot")
        if snapname:
            if params.get("current") == "1":
                raise PveError("'current' and 'snapshot' are mutually exclusive")
            if snapname not in conf.snapshots:
                raise PveError(f"snapshot '{snapname}' does not exist")
            snap = conf.snapshots[snapname]
            values = dict(snap.values)
            if snap.description is not None:
                values["description"] = snap.description
            lxc = snap.lxc
        else:
            values = conf.current(with_pending=params.get("current") != "1")
            lxc = conf.main.lxc
        data = typed(kind, values)
        data["digest"] = conf.digest
        if kind == "lxc" and lxc:
            data["lxc"] = [[k, v] for k, v in lxc]
        return Result(data)

    return handler


def get_pending(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        _node(root, path)
        conf = cfg.load_config(root, kind, _vmid(path))
        deletes = cfg.pending_delete(conf)
        current = conf.current(with_pending=False)
        items = []
        for key in sorted(set(current) | set(conf.pending.values) | set(deletes)):
            if key == "delete":
                continue
            item: dict[str, object] = {"key": key}
            if key in current:
                item["value"] = current[key]
            if key in conf.pending.values:
                item["pending"] = conf.pending.values[key]
            if key in deletes:
                item["delete"] = 2 if deletes[key] else 1
            items.append(item)
        return Result(items)

    return handler


def put_config(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        _node(root, path)
        vmid = _vmid(path)
        update = cu.update_lxc if kind == "lxc" else cu.update_qemu
        res = update(root, vmid, params)
        return Result(None, stdout=res.stdout, warnings=res.warnings)

    return handler


def post_qemu_config(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    """The asynchronous variant: a 'qmconfig' task."""
    _node(root, path)
    vmid = _vmid(path)
    upid = tasks.new_upid(root, "qmconfig", vmid)
    try:
        res = cu.update_qemu(root, vmid, params)
    except ParamError:
        raise  # parameter errors are answered before the worker forks
    except PveError as exc:
        tasks.record_task(root, upid, exc.msg)
        return Result(upid, task_error=exc.msg)
    tasks.record_task(root, upid, None)
    return Result(upid, warnings=res.warnings)


def get_status_index(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    _node(root, path)
    return Result([{"subdir": s} for s in ("current", "start", "stop")])


def get_status_current(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        _node(root, path)
        vmid = _vmid(path)
        if kind == "lxc":
            data = gst.lxc_status(root, vmid)
        else:
            data = gst.qemu_status(root, vmid, full=True)
            data["agent"] = 0
        data["ha"] = {"managed": 0}
        return Result(data)

    return handler


def post_status(kind: str, action: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        _node(root, path)
        vmid = _vmid(path)
        cfg.load_config(root, kind, vmid)
        word = gs.guest_word(kind)
        task_type = {"lxc": "vz", "qemu": "qm"}[kind] + action
        # checked before the worker forks, like the API2 status handlers do
        if action == "start" and gs.is_running(root, kind, vmid):
            raise PveError(f"{word} {vmid} already running")
        if action == "stop" and kind == "lxc" and not gs.is_running(root, kind, vmid):
            raise PveError(f"CT {vmid} not running")
        upid = tasks.new_upid(root, task_type, vmid)
        error = _run_status_task(root, kind, action, vmid)
        tasks.record_task(root, upid, error)
        return Result(upid, task_error=error)

    return handler


def _run_status_task(root: Path, kind: str, action: str, vmid: int) -> str | None:
    try:
        if kind == "qemu":
            (rt.start_qemu if action == "start" else rt.stop_qemu)(root, vmid)
            return None
        answer = (rt.start_lxc if action == "start" else rt.stop_lxc)(root, vmid)
    except PveError as exc:
        return exc.msg
    if answer.get("rc") != 0:
        return str(answer.get("stderr") or "") or f"{action} of CT {vmid} failed"
    return None


def _power_one(action: str) -> startstop.Starter:
    def run(root: Path, kind: str, vmid: int) -> str | None:
        return _run_status_task(root, kind, action, vmid)

    return run


def post_startall(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    """POST /nodes/{node}/startall (pve-manager Nodes.pm): a `startall` task; its failures
    inside are warnings, so the task ends `WARNINGS: n`, never an error."""
    _node(root, path)
    upid = tasks.new_upid(root, "startall", "")
    warnings = startstop.startall(
        root, _power_one("start"), force=params.get("force") == "1", vms=params.get("vms")
    )
    tasks.record_task(root, upid, None, warnings=len(warnings))
    return Result(upid, warnings=warnings)


def post_stopall(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    """POST /nodes/{node}/stopall: a `stopall` task, reverse startup order (startstop.py).
    `timeout` and `force-stop` are accepted and validated; the twin's stop is immediate."""
    _node(root, path)
    upid = tasks.new_upid(root, "stopall", "")
    warnings = startstop.stopall(root, _power_one("stop"), vms=params.get("vms"))
    tasks.record_task(root, upid, None, warnings=len(warnings))
    return Result(upid, warnings=warnings)


def create_guest(kind: str) -> Handler:
    """POST /nodes/{node}/{lxc,qemu}: write the config (the twin allocates no storage)."""

    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        _node(root, path)
        schema = dict(cu.LXC_UPDATE_SCHEMA if kind == "lxc" else cu.QEMU_UPDATE_SCHEMA)
        for key in ("delete", "revert", "digest", "skiplock", "force", "background_delay"):
            schema.pop(key, None)
        schema.update(CREATE_EXTRA[kind])
        validate(params, schema)
        params = dict(params)
        vmid = int(params.pop("vmid"))
        word = gs.guest_word(kind)
        if (
            cfg.config_path(root, kind, vmid).exists()
            or cfg.config_path(root, "qemu" if kind == "lxc" else "lxc", vmid).exists()
        ):
            raise PveError(
                f"unable to create {word} {vmid} - {word} {vmid} already exists on node "
                f"'{cfg.node_name(root)}'"
            )
        conf = cfg.GuestConfig(kind=kind, vmid=vmid)
        for key in CREATE_EXTRA[kind]:
            params.pop(key, None)
        description = params.pop("description", None)
        conf.main.description = description
        for key, value in params.items():
            conf.main.values[key] = _allocate(key, value, vmid)
        if kind == "lxc":
            conf.main.values.setdefault("arch", "amd64")
            conf.main.values.setdefault("unprivileged", "1")
            conf.main.values.setdefault("memory", "512")
            conf.main.values.setdefault("swap", "512")
        else:
            conf.main.values.setdefault(
                "meta", f"creation-qemu={gst.QEMU_VERSION},ctime={int(time.time())}"
            )
            conf.main.values.setdefault("smbios1", f"uuid={uuid.uuid4()}")
            conf.main.values.setdefault("vmgenid", str(uuid.uuid4()))
        cfg.save_config(root, conf)
        upid = tasks.new_upid(root, "vzcreate" if kind == "lxc" else "qmcreate", vmid)
        tasks.record_task(root, upid, None)
        return Result(upid)

    return handler


def _allocate(key: str, value: str, vmid: int) -> str:
    """'STORAGE:SIZE' asks Proxmox to allocate a volume; the twin only names it."""
    m = re.fullmatch(r"([a-z][a-z0-9\-_.]*):(\d+(?:\.\d+)?)((?:,.*)?)", value)
    if not m or not re.fullmatch(r"rootfs|mp\d+|scsi\d+|virtio\d+|sata\d+|ide\d+", key):
        return value
    index = int(re.sub(r"\D", "", key) or 0)
    return f"{m.group(1)}:vm-{vmid}-disk-{index},size={m.group(2)}G{m.group(3)}"


def delete_guest(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        _node(root, path)
        vmid = _vmid(path)
        cfg.load_config(root, kind, vmid)
        if gs.is_running(root, kind, vmid):
            raise PveError(f"{gs.guest_word(kind)} {vmid} is running - destroy failed")
        cfg.config_path(root, kind, vmid).unlink()
        upid = tasks.new_upid(root, "vzdestroy" if kind == "lxc" else "qmdestroy", vmid)
        tasks.record_task(root, upid, None)
        return Result(upid)

    return handler


def get_task_status(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    _node(root, path)
    return Result(tasks.task_status(root, path["upid"]))
