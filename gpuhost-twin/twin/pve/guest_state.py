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
import shutil
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
    """Record a guest as running/stopped (the supervisor does this for real containers), and
    show it where the host's kernel shows it (:func:`show_in_kernel`)."""
    path = state_path(root, kind, vmid)
    if not running:
        path.unlink(missing_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {"status": "running", "started": int(time.time()), **extra}
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(state) + "\n")
        os.replace(tmp, path)
    show_in_kernel(root, kind, vmid, state if running else None)


# --- what a running guest leaves in the host kernel's view -----------------------------------
# Proxmox's own "is it running" tests read these, not its tools' state, and so does gpuhost's
# GuestStatuses probe; the twin keeps them in its /proc (plain files, the simulated kernel's).

UNIX_HEADER = "Num       RefCount Protocol Flags    Type St Inode Path"


def show_in_kernel(root: Path, kind: str, vmid: int, state: dict[str, object] | None) -> None:
    """A container: its LXC monitor's abstract socket ``@/var/lib/lxc/<vmid>/command`` in
    /proc/net/unix (pve-container PVE::LXC::list_active_containers; LXC names the socket
    ``@<lxcpath>/<name>/command``, Proxmox's lxcpath is /var/lib/lxc and the name the vmid).
    A VM: /var/run/qemu-server/<vmid>.pid naming a process whose /proc/<pid>/cmdline is QEMU's
    with ``-pidfile`` that file, not a zombie (qemu-server PVE::QemuServer::Helpers::
    vm_running_locally, parse_cmdline; PVE::ProcFSTools::check_process_running)."""
    if kind == "lxc":
        _write_unix_sockets(root)
        return
    pidfile = root / "run/qemu-server" / f"{vmid}.pid"
    old = _read_pid(pidfile)
    if old is not None:
        shutil.rmtree(root / "proc" / str(old), ignore_errors=True)
    if state is None:
        pidfile.unlink(missing_ok=True)
        return
    pid = int(str(state["pid"]))
    proc = root / "proc" / str(pid)
    proc.mkdir(parents=True, exist_ok=True)
    argv = ["/usr/bin/kvm", "-id", str(vmid), "-name", f"vm{vmid}", "-pidfile"]
    argv.append(f"/var/run/qemu-server/{vmid}.pid")
    (proc / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (proc / "stat").write_text(f"{pid} (kvm) S 1 {pid} {pid} 0 -1 4194560\n")
    pidfile.parent.mkdir(parents=True, exist_ok=True)
    pidfile.write_text(f"{pid}\n")


def forget_kernel_view(root: Path) -> None:
    """A boot: no container sockets, no VM processes (their pid files went with /run)."""
    _write_unix_sockets(root)
    for entry in os.scandir(root / "proc"):  # _write_unix_sockets made it
        if entry.name.isdigit() and not entry.is_symlink():
            shutil.rmtree(entry.path, ignore_errors=True)


def _write_unix_sockets(root: Path) -> None:
    """/proc/net/unix: the header and one listening abstract socket per running container, in
    the kernel's format (net/unix/af_unix.c unix_seq_show; a real line is kept in
    tests/fixtures/captures/guest-statuses)."""
    lines = [UNIX_HEADER]
    ct_dir = root / RUN / "ct"
    running = sorted(int(p.stem) for p in ct_dir.glob("*.json")) if ct_dir.is_dir() else []
    for n, ctid in enumerate(running):
        if is_running(root, "lxc", ctid):
            inode = 20000 + n
            path = f"@/var/lib/lxc/{ctid}/command"
            lines.append(f"{n:016x}: 00000002 00000000 00010000 0001 01 {inode} {path}")
    net = root / "proc/net"
    net.mkdir(parents=True, exist_ok=True)
    tmp = net / ".unix.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, net / "unix")


def _read_pid(pidfile: Path) -> int | None:
    try:
        text = pidfile.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


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
