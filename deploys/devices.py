"""gpuhost's boot units: the NVIDIA device nodes, and the trial boot's deadline timer.

The nvidia driver creates no device nodes, so a unit (files/gpuhost-nvidia-devices.service) makes
them after the modules load and before pve-guests.service starts the guests; it is enabled by its
multi-user.target.wants link. The trial deadline timer (files/gpuhost-trial-deadline.*) reboots
a trial kernel's boot that gpuhost has not confirmed in time; without a trial it does nothing.
With driver.source.installer, nvidia-persistenced's unit (gpuhost-nvidia-persistenced.service)
is enabled the same way, and with VM GPUs the unit that gives gpuhost's PCI mappings the booted
kernel's IOMMU groups before pve-guests.service starts the guests (gpuhost/plan/guests/mappings.py).
"""

from __future__ import annotations

from pyinfra.api import deploy

from deploys.ops import apply_files
from gpuhost.plan.make import Plan


@deploy("NVIDIA device nodes")
def configure(plan: Plan) -> None:
    apply_files(plan, ("devices", "trial", "userspace", "mappings"), "systemd", "Boot units")
