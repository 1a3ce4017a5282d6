"""API handlers that start tasks for guest power: status/start|stop|shutdown|reboot, startall,
stopall (routes.py maps paths here; power.py has the workers, tasks.py runs them)."""

from __future__ import annotations

from pathlib import Path

from . import access, power, startstop, tasks
from .api_handlers import Handler, Result, node_check, vmid_of
from .schema import PveError
from .tasks import Worker

_PREFIX = {"lxc": "vz", "qemu": "qm"}


def task_result(root: Path, upid: str, worker: Worker) -> Result:
    """What the handler returns: the UPID; in the foreground (CLI) also the task's outcome."""
    status = tasks.task_status(root, upid)
    error = tasks.error_of(root, upid) if status["status"] == "stopped" else None
    return Result(upid, stdout=list(worker.lines), warnings=list(worker.warnings),
                  task_error=error)  # fmt: skip


def post_status(kind: str, action: str) -> Handler:
    def handler(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
        node_check(root, path)
        vmid = vmid_of(path)
        power.root_only(params, "skiplock", "keepActive")
        power.precheck(root, kind, action, vmid)
        upid, worker = tasks.fork_worker(
            root,
            _PREFIX[kind] + action,
            vmid,
            lambda w: power.run(root, kind, action, vmid, params, w),
        )
        return task_result(root, upid, worker)

    return handler


def _power_one(action: str) -> startstop.Starter:
    """startall/stopall start and stop each guest in the foreground; a start is a task of its
    own (Nodes.pm startall calls vm_start, which forks `vzstart`/`qmstart`), so its log holds
    what the guest's hookscript printed."""

    def run(root: Path, kind: str, vmid: int) -> str | None:
        if action == "start":
            return tasks.run_sync(
                root, _PREFIX[kind] + action, vmid,
                lambda w: power.run(root, kind, action, vmid, {}, w),
            )  # fmt: skip
        worker = Worker()
        try:
            power.run(root, kind, action, vmid, {}, worker)
        except PveError as exc:
            return exc.msg
        return None

    return run


def _check_vms(root: Path, vms: str | None) -> None:
    """Nodes.pm startall/stopall: VM.PowerMgmt on /, else on /vms/<id> for every listed id."""
    if access.allowed(root, "/", ["VM.PowerMgmt"]):
        return
    ids = startstop.split_list(vms) if vms else []
    if not ids:
        raise access.perm_error("/, VM.PowerMgmt")
    for vmid in ids:
        access.check(root, f"/vms/{vmid}", ["VM.PowerMgmt"])


def post_startall(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    """POST /nodes/{node}/startall (pve-manager Nodes.pm): a `startall` task; failures inside
    are warnings, so the task ends `WARNINGS: n`, never an error."""
    node_check(root, path)
    vms = params.get("vms")
    _check_vms(root, vms)

    def work(w: Worker) -> None:
        for line in startstop.startall(
            root, _power_one("start"), force=params.get("force") == "1", vms=vms
        ):
            w.warn(line)

    upid, worker = tasks.fork_worker(root, "startall", "", work)
    return task_result(root, upid, worker)


def post_stopall(root: Path, path: dict[str, str], params: dict[str, str]) -> Result:
    """POST /nodes/{node}/stopall: a `stopall` task, reverse startup order (startstop.py).
    `timeout` and `force-stop` are accepted and validated; the twin's stop is immediate."""
    node_check(root, path)
    vms = params.get("vms")
    _check_vms(root, vms)

    def work(w: Worker) -> None:
        for line in startstop.stopall(root, _power_one("stop"), vms=vms):
            w.warn(line)

    upid, worker = tasks.fork_worker(root, "stopall", "", work)
    return task_result(root, upid, worker)
