"""Module options and boot-time modules: nvidia_uvm options, nouveau blacklist, vfio at boot.

Each is an owned drop-in (gpuhost-*.conf), written when wanted and removed when not. The
initramfs carries modprobe.d and modules-load.d, so it is rebuilt when the blacklist or the
vfio modules change (or an earlier run changed them and did not get to rebuild it).
"""

from __future__ import annotations

from pyinfra.api import deploy

from deploys.ops import apply_files
from gpuhost.plan import Plan


@deploy("Module options")
def configure(plan: Plan) -> None:
    apply_files(plan, "modules", "initramfs", "Module configuration")
