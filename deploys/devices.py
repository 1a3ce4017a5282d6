"""NVIDIA device nodes at boot: the driver creates none, so a unit makes them for the guests.

The unit (files/gpuhost-nvidia-devices.service) runs after the modules load and before
pve-guests.service starts the guests; it is enabled by its multi-user.target.wants link.
"""

from __future__ import annotations

from pyinfra.api import deploy

from deploys.ops import follow_up, managed_file
from gpuhost.plan import Plan


@deploy("NVIDIA device nodes")
def configure(plan: Plan) -> None:
    reload = next(f for f in plan.follow_ups if f.name == "systemd")
    for item in plan.files.values():
        if item.concern == "devices":
            steps = [reload] if item.path in reload.triggers else []
            managed_file(name=f"Device nodes: {item.path}", item=item, follow_ups=steps)
    follow_up(name="Reload systemd units", step=reload, files=plan.files)
