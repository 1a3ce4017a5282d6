"""Module options and boot-time modules: nvidia_uvm options, nouveau blacklist, vfio at boot.

Each is an owned drop-in (gpuhost-*.conf), written when wanted and removed when not. The
initramfs carries modprobe.d and modules-load.d, so it is rebuilt when the blacklist or the
vfio modules change (or an earlier run changed them and did not get to rebuild it).
"""

from __future__ import annotations

from pyinfra.api import deploy

from deploys.ops import follow_up, managed_file
from gpuhost.plan import Plan


@deploy("Module options")
def configure(plan: Plan) -> None:
    initramfs = next(f for f in plan.follow_ups if f.name == "initramfs")
    for item in plan.files.values():
        if item.concern == "modules":
            steps = [initramfs] if item.path in initramfs.triggers else []
            managed_file(name=f"Module configuration: {item.path}", item=item, follow_ups=steps)
    follow_up(name="Rebuild the initramfs", step=initramfs, files=plan.files)
