"""The PCI control files of sysfs (drivers_probe, drivers/<drv>/bind, unbind) as the kernel
takes them: one request per write, in order, none lost.

A plain file cannot do that: two `echo BDF > drivers_probe` in a row leave only the second. On a
live twin (booted by its supervisor) the control files are FIFOs instead: each write lands in
the pipe as it is made, and whoever applies the requests (the boot, a shim, the supervisor's
tick) drains them in order. A FIFO's writer waits until someone holds it open, so the process
that drives the machine keeps every control FIFO open (read-write, non-blocking): the boot while
it runs, then the supervisor. Tests on a plain root (not live) keep plain files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

_held: dict[str, int] = {}  # path -> fd, in this process


def is_fifo(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(path.lstat().st_mode)
    except OSError:
        return False


def make(path: Path, live: bool) -> None:
    """A control file: a FIFO on a live machine, else an empty plain file."""
    if path.exists() or path.is_symlink():
        return
    if live:
        os.mkfifo(path, 0o200)
        hold(path)
    else:
        path.write_text("")


def hold(path: Path) -> None:
    key = str(path)
    if key in _held:
        with contextlib.suppress(OSError):
            if os.fstat(_held[key]).st_ino == path.stat().st_ino:
                return
        with contextlib.suppress(OSError):
            os.close(_held.pop(key))
    with contextlib.suppress(OSError):
        _held[key] = os.open(path, os.O_RDWR | os.O_NONBLOCK)


def controls(root: Path) -> list[Path]:
    bus = root / "sys/bus/pci"
    found = [bus / "drivers_probe"]
    drivers = bus / "drivers"
    for d in sorted(drivers.iterdir()) if drivers.is_dir() else []:
        found += [d / "unbind", d / "bind"]
    devices = bus / "devices"
    for d in sorted(devices.iterdir()) if devices.is_dir() else []:
        if (d / "reset").exists():  # only functions with a reset method have one
            found.append(d / "reset")
    return found


def hold_all(root: Path) -> None:
    """Hold every control FIFO under root (new drivers' too); let go of vanished ones."""
    live = {str(p) for p in controls(root) if is_fifo(p)}
    for key in list(_held):
        if key.startswith(str(root).rstrip("/") + "/") and key not in live:
            with contextlib.suppress(OSError):
                os.close(_held.pop(key))
    for key in live:
        hold(Path(key))


def drain(path: Path) -> list[str]:
    """The requests written to a control file since the last drain, in order."""
    if not is_fifo(path):
        text = path.read_text() if path.exists() else ""
        if text:
            path.write_text("")
        return text.split()
    chunks = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                raise
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace").split()


def pending(root: Path) -> bool:
    """Whether a request waits in any control file (a FIONREAD-free check: size or a peek)."""
    for path in controls(root):
        if is_fifo(path):
            fd = _held.get(str(path))
            if fd is None:
                continue
            try:
                import fcntl
                import termios

                buf = bytearray(4)
                fcntl.ioctl(fd, termios.FIONREAD, buf)
                if int.from_bytes(buf, "little"):
                    return True
            except OSError:
                continue
        else:
            with contextlib.suppress(OSError):
                if path.stat().st_size:
                    return True
    return False
