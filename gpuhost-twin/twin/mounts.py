"""Mounts of a twin on the machine: overlays on the cached base, the volatile tmpfs a boot gets,
and unmounting everything below a path (host side)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from twin import rootfs
from twin.errors import TwinError


def mounts_below(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    return [p for p in points if p.startswith(prefix) or p == prefix[:-1]]


def unmount_below(path: Path) -> None:
    for _ in range(5):
        points = mounts_below(path)
        if not points:
            return
        for point in sorted(points, key=len, reverse=True):  # deepest first
            if subprocess.run(["umount", point], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True)
    if mounts_below(path):
        raise TwinError(f"cannot unmount {mounts_below(path)}")


def mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    _mount(
        [
            *("-t", "overlay", "overlay", "-o"),
            f"lowerdir={lower},upperdir={upper},workdir={work}",
            str(target),
        ]
    )


def mount_volatile(root: Path) -> None:
    """Fresh /dev and /run for a boot, as devtmpfs and tmpfs are on a real host: nodes and
    runtime state of the previous boot are gone; the boot recreates what should exist."""
    for sub in ("dev", "run"):
        unmount_below(root / sub)
        _mount(["-t", "tmpfs", "-o", "mode=755,size=64m", f"twin-{sub}", str(root / sub)])
    rootfs.make_dev(root / "dev")
    _mount(["--bind", "/dev/pts", str(root / "dev/pts")])  # ptys for interactive shells
    mount_self_proc(root)


# The twin's /proc is plain files (the simulated kernel's), but a process's own entries cannot
# be: /proc/self and /proc/thread-self link into a real procfs mounted under the twin's /run, so
# /proc/self/maps, fd, status... describe the reading process, as on a real host.
KERNEL_PROC = "run/gpuhost-twin/proc"


def mount_self_proc(root: Path) -> None:
    target = root / KERNEL_PROC
    target.mkdir(parents=True, exist_ok=True)
    _mount(["-t", "proc", "-o", "nosuid,nodev,noexec", "twin-proc", str(target)])
    for name in ("self", "thread-self"):
        link = root / "proc" / name
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(f"/{KERNEL_PROC}/{name}")


def _mount(args: list[str]) -> None:
    res = subprocess.run(["mount", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise TwinError(f"mount {' '.join(args)} failed: {res.stderr.strip()}")
