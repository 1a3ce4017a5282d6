"""The twin's /proc/<pid> entries: its own processes, as a real /proc lists them.

The twin's /proc is plain files (the simulated kernel's); the machine's real procfs is mounted
at /run/gpuhost-twin/proc inside it (mounts.py). The supervisor keeps a link /proc/<pid> ->
/run/gpuhost-twin/proc/<pid> for every process chrooted into the twin (its sessions, daemons
and its LXC guests' processes), so tools that walk /proc (fuser, lsof, ps, a scan of
/proc/*/fd) see the twin's processes and no other twin's. Links follow the processes within
the supervisor's tick (half a second); a process that just started may not be listed yet.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from twin.mounts import KERNEL_PROC


def twin_pids(tdir: Path) -> set[int]:
    """Processes whose root directory is the twin's or lies under it (its guests)."""
    prefix = str(tdir.resolve()) + "/"
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            root = os.readlink(f"/proc/{entry.name}/root")
        except OSError:
            continue
        if root.startswith(prefix):
            found.add(int(entry.name))
    return found


def sync_pid_links(root: Path, tdir: Path) -> None:
    proc = root / "proc"
    if not proc.is_dir():
        return
    wanted = twin_pids(tdir)
    have = {int(e.name) for e in os.scandir(proc) if e.name.isdigit() and e.is_symlink()}
    for pid in have - wanted:
        (proc / str(pid)).unlink(missing_ok=True)
    for pid in wanted - have:
        with contextlib.suppress(FileExistsError):
            os.symlink(f"/{KERNEL_PROC}/{pid}", proc / str(pid))
