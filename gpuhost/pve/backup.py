"""Backups of guest configs before gpuhost changes them, and how to restore one.

Each backup is a copy of /etc/pve/lxc/<id>.conf or /etc/pve/qemu-server/<id>.conf on the host,
taken right before the first change of a run, as
/var/lib/gpuhost/backups/<kind>-<id>-<UTC time>.conf (kind: lxc | qemu; time YYYYmmddTHHMMSSZ,
so names sort by age); the newest KEEP of each guest are kept. The directory is root-only: a
config can carry secrets (cloud-init passwords).

Restore (as root on the host, the guest stopped):
    cp /var/lib/gpuhost/backups/lxc-200-20261201T231500Z.conf /etc/pve/lxc/200.conf
"""

from __future__ import annotations

import shlex

from gpuhost.paths import STATE_DIR

BACKUP_DIR = f"{STATE_DIR}/backups"
KEEP = 10
CONFIG_DIRS = {"lxc": "/etc/pve/lxc", "qemu": "/etc/pve/qemu-server"}


def config_path(kind: str, vmid: int) -> str:
    """The guest's config file as Proxmox keeps it for this node."""
    if kind not in CONFIG_DIRS:
        raise ValueError(f"guest kind {kind!r} is not one of {', '.join(CONFIG_DIRS)}")
    if isinstance(vmid, bool) or not isinstance(vmid, int) or not 100 <= vmid <= 999_999_999:
        raise ValueError(f"guest id {vmid!r} is not a Proxmox vmid (100-999999999)")
    return f"{CONFIG_DIRS[kind]}/{vmid}.conf"


def backup_command(kind: str, vmid: int, keep: int = KEEP) -> str:
    """Shell that copies the guest's config into the backups and prunes them to ``keep``.

    Within one second the first copy wins (the state before gpuhost's change is the one to
    keep). Fails, so the change that follows never runs, when the config cannot be copied."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    src = shlex.quote(config_path(kind, vmid))
    prefix = f"{BACKUP_DIR}/{kind}-{int(vmid)}-"
    return (
        f"mkdir -p {BACKUP_DIR} && chmod 700 {BACKUP_DIR} && "
        f'b={prefix}$(date -u +%Y%m%dT%H%M%SZ).conf && {{ [ -e "$b" ] || cp -p {src} "$b"; }} && '
        f"ls -1 {prefix}*.conf | sort | head -n -{int(keep)} | xargs -r rm -f --"
    )
