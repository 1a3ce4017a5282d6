"""Tasks: asynchronous API calls answer with a UPID; its status is recorded here (stdlib only)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from . import config as cfg
from .guest_state import RUN
from .schema import PveError

# --- tasks (asynchronous API calls answer with a UPID) ---


def new_upid(root: Path, task_type: str, vmid: int | str, user: str = "root@pam") -> str:
    pid = os.getpid()
    now = int(time.time())
    pstart = int(time.monotonic() * 100) & 0xFFFFFFFF
    return f"UPID:{cfg.node_name(root)}:{pid:08X}:{pstart:08X}:{now:08X}:{task_type}:{vmid}:{user}:"


def record_task(root: Path, upid: str, error: str | None, warnings: int = 0) -> None:
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
        "exitstatus": _exitstatus(error, warnings),
    }
    tasks = root / RUN / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    (tasks / f"{_task_key(upid)}.json").write_text(json.dumps(task) + "\n")


def _exitstatus(error: str | None, warnings: int) -> str:
    """PVE::RESTEnvironment: an error's text, else `WARNINGS: n` when the worker warned, else OK."""
    if error is not None:
        return error.strip().splitlines()[-1]
    return f"WARNINGS: {warnings}" if warnings else "OK"


def task_status(root: Path, upid: str) -> dict[str, object]:
    try:
        return dict(json.loads((root / RUN / "tasks" / f"{_task_key(upid)}.json").read_text()))
    except FileNotFoundError:
        raise PveError(f"no such task '{upid}'") from None


def _task_key(upid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", upid)
