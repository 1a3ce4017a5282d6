"""The handlers of the Proxmox API paths the twin serves (routes.py maps paths to them): version,
nodes, guests' config, pending, status, start/stop, create/delete, task status. Shapes follow
pve-manager/pve-container/qemu-server API2 modules (docs/reference/formats.md §4); handlers return plain data."""

from __future__ import annotations

import random
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import access, guest_perms, mapping, tasks
from . import config as cfg
from . import config_update as cu
from . import guest_state as gs
from . import guest_status as gst
from . import options as opts
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


def node_check(root: Path, path_params: dict[str, str]) -> None:
    node = path_params.get("node")
    if node is not None and node != cfg.node_name(root) and node != "localhost":
        raise PveError(
            f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
            "Name or service not known"
        )


def vmid_of(path_params: dict[str, str]) -> int:
    """pve-vmid: type integer first, then the format (JSONSchema check_prop's order)."""
    errors: dict[str, str] = {}
    if not re.fullmatch(r"[+-]?\d+", path_params["vmid"]):
        raise ParamError({"vmid": f"type check ('integer') failed - got '{path_params['vmid']}'"})
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
    from .versions import version_info  # pve-manager's PVE::pvecfg::version_info

    return Result(version_info(root))


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
    node_check(root, path)
    return Result([{"name": n} for n in ("lxc", "qemu", "tasks", "version")])


def list_guests(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        node_check(root, path)
        rows = gst.list_guests(root, kind, full=params.get("full") == "1")
        # only guests the caller may audit; Perl walks a hash, so no order is promised
        rows = [r for r in rows if access.allowed(root, f"/vms/{r['vmid']}", ["VM.Audit"])]
        random.shuffle(rows)
        return Result(rows)

    return handler


def guest_index(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        node_check(root, path)
        cfg.load_config(root, kind, vmid_of(path))
        return Result([{"subdir": s} for s in ("config", "pending", "status")])

    return handler


def get_config(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        node_check(root, path)
        vmid = vmid_of(path)
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
        node_check(root, path)
        conf = cfg.load_config(root, kind, vmid_of(path))
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
        node_check(root, path)
        vmid = vmid_of(path)
        update = cu.update_lxc if kind == "lxc" else cu.update_qemu
        res = update(root, vmid, params)
        return Result(None, stdout=res.stdout, warnings=res.warnings)

    return handler


def post_qemu_config(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    """The asynchronous variant: a 'qmconfig' task; errors before the worker are HTTP errors.
    With background_delay the call waits up to that many seconds: null when the task ended OK,
    "failed to update VM N: <error>" when it failed, else the UPID (Qemu.pm update_vm_api)."""
    node_check(root, path)
    vmid = vmid_of(path)
    delay = int(params["background_delay"]) if params.get("background_delay") else 0
    started: list[tuple[str, tasks.Worker]] = []

    def fork(work: Callable[[cu.UpdateResult], None]) -> cu.UpdateResult:
        result = cu.UpdateResult()

        def run(worker: tasks.Worker) -> None:
            work(result)
            for line in result.stdout:
                worker.log(line)
            for line in result.warnings:
                worker.warn(line)

        started.append(tasks.fork_worker(root, "qmconfig", vmid, run))
        return result

    cu.update_qemu(root, vmid, params, fork=fork)
    upid, worker = started[0]
    if delay:
        status = tasks.wait(root, upid, timeout=delay)
        if status["status"] == "stopped":
            error = tasks.error_of(root, upid)
            if error is not None:
                raise PveError(f"failed to update VM {vmid}: {error}")
            return Result(None)
    status = tasks.task_status(root, upid)
    error = tasks.error_of(root, upid) if status["status"] == "stopped" else None
    return Result(upid, stdout=list(worker.lines), warnings=list(worker.warnings),
                  task_error=error)  # fmt: skip


def get_status_index(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    node_check(root, path)
    return Result([{"subdir": s} for s in ("current", "start", "stop")])


def get_status_current(kind: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        node_check(root, path)
        vmid = vmid_of(path)
        if kind == "lxc":
            data = gst.lxc_status(root, vmid)
        else:
            data = gst.qemu_status(root, vmid, full=True)
            agent = cfg.load_config(root, "qemu", vmid).main.values.get("agent", "")
            if re.match(r"(enabled=)?1(,|$)", agent):
                data["agent"] = 1  # reported only when the agent is enabled
        data["ha"] = {"managed": 0}
        return Result(data)

    return handler


def create_guest(kind: str) -> Handler:
    """POST /nodes/{node}/{lxc,qemu}: write the config (the twin allocates no storage)."""

    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        node_check(root, path)
        schema = dict(cu.LXC_UPDATE_SCHEMA if kind == "lxc" else cu.QEMU_UPDATE_SCHEMA)
        for key in ("delete", "revert", "digest", "skiplock", "force", "background_delay"):
            schema.pop(key, None)
        schema.update(CREATE_EXTRA[kind])
        validate(params, schema)
        params = dict(params)
        vmid = int(params.pop("vmid"))
        access.check(root, f"/vms/{vmid}", ["VM.Allocate"])
        for key, value in params.items():  # check_vm_create_hostpci_perm, devN for CTs
            if kind == "qemu" and re.fullmatch(r"hostpci\d+", key):
                guest_perms.check_hostpci(root, vmid, key, value)
            if kind == "lxc" and re.fullmatch(r"dev\d+", key):
                guest_perms.check_lxc_options(root, vmid, [key], [])
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
            if cfg.pve_release(root) >= 9:  # pve-container 103068a (6.0.6+): CTs default to
                conf.main.values.setdefault("unprivileged", "1")  # unprivileged; 5.x: privileged
            conf.main.values.setdefault("memory", "512")
            conf.main.values.setdefault("swap", "512")
        else:
            conf.main.values.setdefault(
                "meta",
                f"creation-qemu={gst.QEMU_VERSIONS[cfg.pve_release(root)]},ctime={int(time.time())}",
            )
            conf.main.values.setdefault("smbios1", f"uuid={uuid.uuid4()}")
            conf.main.values.setdefault("vmgenid", str(uuid.uuid4()))
        cfg.save_config(root, conf)
        upid, _ = tasks.fork_worker(root, "vzcreate" if kind == "lxc" else "qmcreate", vmid,
                                    lambda w: None)  # fmt: skip
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
        node_check(root, path)
        vmid = vmid_of(path)
        cfg.load_config(root, kind, vmid)
        if gs.is_running(root, kind, vmid):
            raise PveError(f"{gs.guest_word(kind)} {vmid} is running - destroy failed")
        cfg.config_path(root, kind, vmid).unlink()
        upid, _ = tasks.fork_worker(root, "vzdestroy" if kind == "lxc" else "qmdestroy", vmid,
                                    lambda w: None)  # fmt: skip
        return Result(upid)

    return handler


def get_task_status(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    node_check(root, path)
    return Result(tasks.task_status(root, path["upid"]))


def get_task_log(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    """GET /nodes/{node}/tasks/{upid}/log: [{n, t}] lines (no paging in the twin)."""
    node_check(root, path)
    lines = tasks.task_log(root, path["upid"])
    return Result([{"n": i + 1, "t": t} for i, t in enumerate(lines)])


# --- /cluster/mapping/pci (mapping.py) ---


def get_mappings(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    return Result(mapping.api_list(root, params))


def get_mapping(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    return Result(mapping.api_get(root, path["id"]))


def post_mapping(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    mapping.api_create(root, params)
    return Result(None)


def put_mapping(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    mapping.api_update(root, path["id"], params)
    return Result(None)


def delete_mapping(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    mapping.api_delete(root, path["id"])
    return Result(None)
