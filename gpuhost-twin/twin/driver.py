"""Give a running twin an installed NVIDIA driver: real tiny .ko files for its booted kernel,
GSP firmware and the userspace libraries (libcuda, libnvidia-ml: twin/userspace.py), as a host
whose driver was installed earlier has. Then boot it. ``install_userspace`` gives a guest the
userspace alone, like `NVIDIA-Linux-x86_64-<ver>.run --no-kernel-modules` run inside it.

The real NVIDIA module cannot be built here (docs/development.md); these modules carry the version,
vermagic and compiler of a real build, which is all the simulated kernel checks.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from twin import mounts, node, processes, userspace
from twin.errors import TwinError
from twin.modbuild import ModuleCache


def ssh(twin: node.Twin, command: str, timeout: int = 60) -> str:
    run = subprocess.run(
        ["ssh", "-F", str(node.ssh_config()), f"root@{twin.address}", command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if run.returncode != 0:
        raise TwinError(f"{twin.name}: {command!r} failed: {run.stderr.strip()}")
    return run.stdout


def reboot(twin: node.Twin, timeout: float = 60.0) -> None:
    """Reboot from inside and wait until the twin answers SSH with a new boot id."""
    boot_id = twin.root / "proc/sys/kernel/random/boot_id"
    before = boot_id.read_text()
    subprocess.run(
        ["ssh", "-F", str(node.ssh_config()), f"root@{twin.address}", "reboot"],
        capture_output=True,
        timeout=30,
    )
    deadline = time.monotonic() + timeout
    while boot_id.read_text() == before or not processes.wait_port(twin.address, 22, timeout=0.5):
        if time.monotonic() > deadline:
            raise TwinError(f"{twin.name} did not come back within {timeout} s")
        time.sleep(0.05)


def install(twin: node.Twin, version: str, cache: ModuleCache | None = None) -> bool:
    """Install driver ``version`` for the booted kernel unless present; reboot. True if it did."""
    kver = ssh(twin, "uname -r").strip()
    if (twin.root / f"lib/firmware/nvidia/{version}").is_dir():
        return False
    (cache or ModuleCache()).install(twin.root, kver, version=version)
    userspace.install_root(twin.root, version)
    reboot(twin)
    return True


def install_userspace(twin: node.Twin, ctid: int, version: str) -> None:
    """Install the NVIDIA userspace of ``version`` (any version: a different one than the host's
    plants a guest driver mismatch) into guest ``ctid``'s rootfs, running or not."""
    gdir = twin.dir / "guests" / str(ctid)
    groot = gdir / "root"
    if mounts.mounts_below(groot):  # running: through its mounted overlay
        userspace.install_root(groot, version)
        return
    # Stopped: mount its overlay for the install (ldconfig must see the whole tree), as start does.
    for sub in ("upper", "work", "root"):
        (gdir / sub).mkdir(mode=0o755, parents=True, exist_ok=True)
    mounts.mount_overlay(Path(twin.base), gdir / "upper", gdir / "work", groot)
    try:
        userspace.install_root(groot, version)
    finally:
        mounts.unmount_below(groot)
