"""Processes of a twin on the machine: who runs chrooted into it, killing them, waiting for a
port to answer, and whether a system sshd takes port 22 from the twins (host side; /proc of
the machine, not of the twin)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from twin.errors import TwinError


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def descendants(pid: int) -> list[int]:
    """Every process below pid (children, their children...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def twin_processes(tdir: Path, exclude: Iterable[int] = ()) -> list[int]:
    """Processes that belong to a twin: chrooted into anything under it, or started with its
    paths on their command line (its sshd, its guests' LXC monitors)."""
    prefix = str(tdir.resolve())
    skip = {os.getpid(), *exclude}
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            root = os.readlink(entry / "root")
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        mine = any(a == prefix or prefix + "/" in a for a in args)
        if root.startswith(prefix + "/") or mine:
            pids.append(int(entry.name))
    return pids


def kill_processes(tdir: Path, exclude: Iterable[int] = ()) -> None:
    for _ in range(20):  # kill until none is left: a dying shell may have just forked
        pids = [p for p in twin_processes(tdir, exclude) if _alive(p)]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    raise TwinError(f"processes of {tdir} survive SIGKILL: {twin_processes(tdir, exclude)}")


def wait_port(
    address: str,
    port: int = 22,
    timeout: float = 10.0,
    alive: subprocess.Popen[bytes] | None = None,
) -> bool:
    """Wait until an SSH server greets on address:port (False on timeout or if `alive` exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (alive is None or alive.poll() is None):
        try:
            with socket.create_connection((address, port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH"):
                    return True
        except OSError:
            time.sleep(0.02)
    return False


# --- the machine's own sshd --------------------------------------------------------------------

WILDCARD_SSHD = (
    "the machine's own sshd listens on all addresses, port 22 ({where}); twins need "
    "127.0.0.N:22: stop it (systemctl stop ssh) or set ListenAddress in /etc/ssh/sshd_config "
    "to specific addresses"
)


def wildcard_port_22(tcp: str, tcp6: str = "") -> list[str]:
    """LISTEN sockets on every address, port 22, in /proc/net/tcp and tcp6 text (0.0.0.0:22, [::]:22).

    Such a socket takes 127.0.0.N:22 from every twin's sshd (and, for [::], IPv4 too)."""
    found = []
    for text, label in ((tcp, "0.0.0.0:22"), (tcp6, "[::]:22")):
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "0A":  # 0A: TCP_LISTEN
                continue
            addr, _, port = fields[1].partition(":")
            if port.upper() == "0016" and set(addr) == {"0"}:
                found.append(label)
    return sorted(set(found))


def port_22_problem() -> str | None:
    """Why twins' sshds cannot listen here, or None: a system sshd on 0.0.0.0:22 / [::]:22."""
    texts = []
    for name in ("tcp", "tcp6"):
        try:
            texts.append(Path(f"/proc/net/{name}").read_text())
        except OSError:
            texts.append("")
    where = wildcard_port_22(*texts)
    return WILDCARD_SSHD.format(where=", ".join(where)) if where else None
