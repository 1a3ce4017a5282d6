"""NVIDIA device nodes at boot: the driver creates none, so a unit makes them for the guests.

The unit (files/gpuhost-nvidia-devices.service) runs after the modules load and before
pve-guests.service starts the guests; it is enabled by its multi-user.target.wants link.
"""

from __future__ import annotations

from pyinfra.api import deploy

from deploys.ops import apply_files
from gpuhost.plan import Plan


@deploy("NVIDIA device nodes")
def configure(plan: Plan) -> None:
    apply_files(plan, "devices", "systemd", "Device nodes")
