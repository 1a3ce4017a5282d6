"""A guest's running state and its locks (stdlib only): containers' state is written by the
plumbing's supervisor (<root>/run/gpuhost-twin/ct/<ctid>.json, {"status": "running", ...}, removed
when it stops; /run is fresh every boot); VMs are state only (<root>/run/gpuhost-twin/qemu/<vmid>.json).
Container start/stop/exec go to the supervisor through <root>/run/gpuhost-twin/requests (the
protocol of twin/shims/twinreq.py, re-implemented here so it honours a root prefix)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from .schema import PveError

RUN = "run/gpuhost-twin"


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


@contextlib.contextmanager
def file_lock(root: Path, name: str) -> Iterator[None]:
    """cfs_lock_file for a cluster-wide file (e.g. mapping/pci.cfg): one writer at a time."""
    lockdir = root / "run/lock/pve-cluster"
    lockdir.mkdir(parents=True, exist_ok=True)
    with open(lockdir / f"{name}.lock", "a") as handle:
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


def set_acpi_ignored(root: Path, vmid: int, ignored: bool = True) -> None:
    """Twin knob: make a running VM's (absent) guest OS ignore ACPI powerdown requests, so a
    shutdown runs into its timeout. Holds until the VM stops."""
    state = running_state(root, "qemu", vmid)
    if state is None:
        raise PveError(f"VM {vmid} not running")
    state["acpi_ignored"] = ignored
    path = state_path(root, "qemu", vmid)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, path)
