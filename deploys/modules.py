"""Module options and boot-time modules: nvidia_uvm options, nouveau blacklist, vfio at boot.

Each is an owned drop-in (gpuhost-*.conf), written when wanted and removed when not. The
initramfs carries modprobe.d (initramfs-tools' kmod hook copies it; modules-load.d it does not),
so the target kernel's initramfs is rebuilt when they change (or an earlier run changed them
and did not get to rebuild it). While a trial boot is due on a host with trial entries the
rebuild waits for its commit: the trial boots an initramfs of its own and the fallback's stays.
"""

from __future__ import annotations

from pyinfra.api import deploy

from deploys.ops import apply_files
from gpuhost.plan.make import Plan


@deploy("Module options")
def configure(plan: Plan) -> None:
    at_commit = plan.boot_config_at_commit
    apply_files(plan, "modules", "initramfs", "Module configuration", run_step=not at_commit)
