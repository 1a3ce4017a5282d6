"""Guest config backups as an operation, for deploys that change a guest's config.

The containers deploy takes its backup inside its own change (the first command of it); a deploy
that edits a VM's config (hostpciN, machine) can run this right before its change:

    guest_config_backup(name="Back up VM 129's config", kind="qemu", vmid=129)
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from gpuhost.pve.backup import BACKUP_DIR, KEEP, backup_command


@operation(is_idempotent=False)
def guest_config_backup(kind: str, vmid: int, keep: int = KEEP):
    """
    Copy a guest's config to /var/lib/gpuhost/backups/<kind>-<id>-<UTC time>.conf, keeping the
    newest ``keep`` of that guest.

    + kind: "lxc" or "qemu"
    + vmid: the guest's id
    + keep: how many backups of this guest to keep
    """
    host.log(f"backing up {kind} {vmid}'s config into {BACKUP_DIR}")
    yield backup_command(kind, vmid, keep)
