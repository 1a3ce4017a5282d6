"""Host checks of storage: ZFS pools (`zpool status -x`) and Proxmox storages (`pvesm status`).

A new kernel can boot and still lose the host's data: a kernel without zfs.ko imports no pool,
one without the driver of a disk controller leaves its pool UNAVAIL and the storages on it
inactive. Guests start from these storages right after a commit, so the trial gate checks them.
"""

from __future__ import annotations

from gpuhost.audit.context import AuditContext
from gpuhost.audit.model import Finding, NotApplicable, check

BACK = (
    "if this boot is a trial of a new kernel, it is not committed and the host goes back to "
    "the known-good one"
)


@check("storage.zfs", "ZFS pools are healthy (zpool status -x)")
def storage_zfs(ctx: AuditContext) -> list[Finding]:
    health = ctx.host.storage
    if health is None:
        raise NotApplicable("storage health not captured")
    facts = ctx.host.facts
    uses = facts.zfs.reason(facts.cmdline)
    if health.zpool is None:
        if uses:
            return [Finding("zpool", f"installed (this host uses ZFS: {uses})", "missing", BACK)]
        raise NotApplicable("zpool is not installed and the host uses no ZFS")
    if health.zpool.error:
        if not uses:
            raise NotApplicable(f"no ZFS in use (zpool: {health.zpool.error})")
        return [
            Finding(
                "zpool status -x",
                "the pools' health",
                health.zpool.error,
                f"the booted kernel must carry zfs.ko (Proxmox's packaging); {BACK}",
            )
        ]
    return [
        Finding(
            f"zpool {name}",
            "ONLINE",
            state,
            f"see `zpool status -v {name}` (a disk this kernel has no driver for shows "
            f"UNAVAIL); {BACK}",
        )
        for name, state in sorted(health.zpool.unhealthy.items())
    ]


@check("storage.pve", "Every enabled Proxmox storage is active (pvesm status)")
def storage_pve(ctx: AuditContext) -> list[Finding]:
    health = ctx.host.storage
    if health is None:
        raise NotApplicable("storage health not captured")
    if health.pvesm is None:
        raise NotApplicable("pvesm is not installed (not a Proxmox VE host)")
    if health.pvesm.error:
        return [Finding("pvesm status", "the storages' status", health.pvesm.error, BACK)]
    said = "; ".join(health.pvesm.warnings)
    return [
        Finding(
            f"storage {name} ({kind})",
            "active",
            status + (f" ({said})" if said else ""),
            f"see `pvesm status` and what backs {name} (pool, mount, volume group); {BACK}",
        )
        for name, (kind, status) in sorted(health.pvesm.storages.items())
        if status == "inactive"
    ]
