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


def _sorted_names(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


def controls(root: Path) -> list[Path]:
    # The supervisor asks 20 times a second for as long as its twin runs: plain os calls on
    # strings here, not pathlib (a third of the CPU time).
    bus = os.path.join(root, "sys/bus/pci")
    found = [Path(bus, "drivers_probe")]
    drivers = os.path.join(bus, "drivers")
    for name in _sorted_names(drivers):
        found += [Path(drivers, name, "unbind"), Path(drivers, name, "bind")]
    devices = os.path.join(bus, "devices")
    for name in _sorted_names(devices):
        reset = os.path.join(devices, name, "reset")
        if os.path.exists(reset):  # only functions with a reset method have one
            found.append(Path(reset))
    return found


def hold_all(root: Path) -> list[Path]:
    """Hold every control FIFO under root (new drivers' too); let go of vanished ones.
    Returns the control files (for pending(), saving it the same walk)."""
    found = controls(root)
    live: dict[str, int] = {}  # path -> inode of each control that is a FIFO
    for path in found:
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if stat.S_ISFIFO(st.st_mode):
                live[str(path)] = st.st_ino
    for key in list(_held):
        if key.startswith(str(root).rstrip("/") + "/") and key not in live:
            with contextlib.suppress(OSError):
                os.close(_held.pop(key))
    for key, inode in live.items():  # hold(), with the inode just read
        if key in _held:
            with contextlib.suppress(OSError):
                if os.fstat(_held[key]).st_ino == inode:
                    continue
            with contextlib.suppress(OSError):
                os.close(_held.pop(key))
        with contextlib.suppress(OSError):
            _held[key] = os.open(key, os.O_RDWR | os.O_NONBLOCK)
    return found


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


def pending(root: Path, found: list[Path] | None = None) -> bool:
    """Whether a request waits in any control file (a FIONREAD-free check: size or a peek);
    ``found``: controls(root), when the caller has it."""
    for path in controls(root) if found is None else found:
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
