"""Tasks: asynchronous API calls answer with a UPID at once and run in a worker (stdlib only).

Like PVE::RESTEnvironment::fork_worker: the UPID names the node, the worker, the start time, the
task type, its id and the caller (a token id for API tokens). Over HTTPS the worker runs in a
thread of the API server, so a task is `running` first and `stopped` later; it runs at least
TASK_MIN_SECONDS (env TWIN_TASK_MIN_SECONDS, default 0.3) so a client that does not poll sees it
running. From the CLI (pvesh, qm) the worker runs in the foreground, as Proxmox's CLI does.
The exit status is `OK`, `WARNINGS: n` when the worker warned, or the error text with newlines
turned into spaces (PVE::RESTEnvironment). Status lives in <root>/run/gpuhost-twin/tasks/ (fresh
every boot); a task whose worker process is gone reads `stopped` / "unexpected status".
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from . import access
from . import config as cfg
from .guest_state import RUN
from .schema import ParamError, PveError

UPID_RE = re.compile(
    r"UPID:([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):"
    r"([0-9A-Fa-f]{8}):([^:\s]+):([^:\s]*):([^:\s]+):"
)

_SYNC: contextvars.ContextVar[bool] = contextvars.ContextVar("pve_task_sync", default=True)
_counter = 0
_counter_lock = threading.Lock()


def min_seconds() -> float:
    return float(os.environ.get("TWIN_TASK_MIN_SECONDS", "0.3"))


@contextlib.contextmanager
def background() -> Iterator[None]:
    """Run workers in threads (the HTTPS API); without it they run in the foreground (CLI)."""
    token = _SYNC.set(False)
    try:
        yield
    finally:
        _SYNC.reset(token)


class Worker:
    """What a task's code gets: warn() counts towards `WARNINGS: n`; log() adds a line."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.lines: list[str] = []

    def warn(self, message: str) -> None:
        self.warnings.append(message.rstrip("\n"))

    def log(self, message: str) -> None:
        self.lines.append(message.rstrip("\n"))


Work = Callable[[Worker], None]


def run_sync(root: Path, task_type: str, vmid: int | str, work: Work) -> str | None:
    """A task run to its end in the caller's thread (pve-manager's startall waits for each
    guest's start task, Nodes.pm); returns its error (None: OK or warnings)."""
    token = _SYNC.set(True)
    try:
        upid, _ = fork_worker(root, task_type, vmid, work)
    finally:
        _SYNC.reset(token)
    return error_of(root, upid)


def new_upid(root: Path, task_type: str, vmid: int | str, user: str | None = None) -> str:
    global _counter
    with _counter_lock:
        _counter += 1
        pstart = (int(time.monotonic() * 100) + _counter) & 0xFFFFFFFF
    user = user or access.caller()
    now = int(time.time())
    return (
        f"UPID:{cfg.node_name(root)}:{os.getpid():08X}:{pstart:08X}:{now:08X}:"
        f"{task_type}:{vmid}:{user}:"
    )


def fork_worker(root: Path, task_type: str, vmid: int | str, work: Work) -> tuple[str, Worker]:
    """Start a task; returns its UPID and the worker (already finished in the foreground)."""
    upid = new_upid(root, task_type, vmid)
    worker = Worker()
    _write(root, upid, {"status": "running"})
    if _SYNC.get():
        _finish(root, upid, worker, work, 0.0)
        return upid, worker
    ctx = contextvars.copy_context()  # the caller's identity travels with the worker
    thread = threading.Thread(
        target=ctx.run, args=(_finish, root, upid, worker, work, min_seconds()), daemon=True
    )
    thread.start()
    return upid, worker


def _finish(root: Path, upid: str, worker: Worker, work: Work, at_least: float) -> None:
    started = time.monotonic()
    error: str | None = None
    try:
        work(worker)
    except PveError as exc:
        error = exc.msg
        if isinstance(exc, ParamError):
            error += "".join(f"{k}: {v}\n" for k, v in sorted(exc.errors.items()))
    except Exception as exc:  # a twin bug: fail the task visibly instead of hanging it
        error = f"twin internal error: {type(exc).__name__}: {exc}"
        traceback.print_exc()
    time.sleep(max(0.0, at_least - (time.monotonic() - started)))
    _write(
        root,
        upid,
        {
            "status": "stopped",
            "endtime": int(time.time()),
            "exitstatus": exitstatus(error, len(worker.warnings)),
            "log": [*worker.lines, *(f"WARN: {w}" for w in worker.warnings)],
        },
    )


def error_of(root: Path, upid: str) -> str | None:
    """The error of a finished task (None if it ended OK or with warnings)."""
    status = task_status(root, upid)
    text = str(status.get("exitstatus", ""))
    return None if text == "OK" or text.startswith("WARNINGS: ") else text


def wait(root: Path, upid: str, timeout: float = 60.0) -> dict[str, object]:
    """Poll a task until it stopped (for the twin's own callers, like blocking_status)."""
    deadline = time.monotonic() + timeout
    while True:
        status = task_status(root, upid)
        if status["status"] == "stopped" or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def exitstatus(error: str | None, warnings: int) -> str:
    """PVE::RESTEnvironment: the error's text on one line, else `WARNINGS: n`, else OK."""
    if error is not None:
        return re.sub(r"\s*\n\s*", " ", error.strip())
    return f"WARNINGS: {warnings}" if warnings else "OK"


def _write(root: Path, upid: str, fields: dict[str, object]) -> None:
    m = UPID_RE.fullmatch(upid)
    assert m is not None, upid
    path = _path(root, upid)
    path.parent.mkdir(parents=True, exist_ok=True)
    task = {
        "upid": upid,
        "node": m.group(1),
        "pid": int(m.group(3), 16),
        "pstart": int(m.group(4), 16),
        "starttime": int(m.group(5), 16),
        "type": m.group(6),
        "id": m.group(7),
        "user": m.group(8),
        **fields,
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(task) + "\n")
    os.replace(tmp, path)


def task_status(root: Path, upid: str) -> dict[str, object]:
    """GET /nodes/{node}/tasks/{upid}/status (pve-manager API2/Tasks.pm read_task_status)."""
    m = UPID_RE.fullmatch(upid)
    if not m:
        raise ParamError({"upid": "unable to parse worker upid"})
    try:
        task = dict(json.loads(_path(root, upid).read_text()))
    except (FileNotFoundError, ValueError):
        raise ParamError({"upid": "no such task"}) from None
    _check_owner(root, task)
    task.pop("log", None)
    if task["status"] == "running" and not _alive(int(task["pid"])):
        task.update(status="stopped", exitstatus="unexpected status")
    if task["status"] == "running":
        task.pop("exitstatus", None)
    return task


def task_log(root: Path, upid: str) -> list[str]:
    if not UPID_RE.fullmatch(upid):
        raise ParamError({"upid": "unable to parse worker upid"})
    try:
        task = dict(json.loads(_path(root, upid).read_text()))
    except (FileNotFoundError, ValueError):
        raise ParamError({"upid": "no such task"}) from None
    _check_owner(root, task)
    lines = list(task.get("log", []))
    if task["status"] == "stopped":
        status = str(task.get("exitstatus"))
        lines.append(f"TASK {status}" if status == "OK" or status.startswith("WARN")
                     else f"TASK ERROR: {status}")  # fmt: skip
    return lines


def _check_owner(root: Path, task: dict[str, object]) -> None:
    """$check_task_user: a token sees its own tasks, a user its own and its tokens'; others
    need Sys.Audit on /nodes/<node>."""
    user, owner = access.caller(), str(task["user"])
    if user == owner or owner.split("!", 1)[0] == user:
        return
    access.check(root, f"/nodes/{task['node']}", ["Sys.Audit"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _path(root: Path, upid: str) -> Path:
    return root / RUN / "tasks" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', upid)}.json"
