"""gpuhost's boot units, each concern under its own heading, then one systemd daemon-reload.

- NVIDIA device nodes: the nvidia driver creates none, so a unit
  (files/gpuhost-nvidia-devices.service) makes them after the modules load and before pve-guests.service starts the guests; it is enabled
  by its multi-user.target.wants link. With driver.source.installer, nvidia-persistenced's unit
  (gpuhost-nvidia-persistenced.service) is enabled the same way.
- Trial boot deadline: a timer (files/gpuhost-trial-deadline.*) reboots a trial kernel's boot that
  gpuhost has not confirmed in time, and the guests wait for the trial's checks (trial-hold);
  without a trial they do nothing.
- PCI mappings at boot: with VM GPUs, the unit that gives gpuhost's PCI mappings the booted
  kernel's IOMMU groups before pve-guests.service starts the guests
  (gpuhost/plan/guests/mappings.py).
"""

from __future__ import annotations

from pyinfra.api import deploy

from deploys.ops import apply_files, follow_up
from gpuhost.plan.make import Plan

STEP = "systemd"  # the follow-up every unit file here triggers: systemctl daemon-reload
LABEL = "Boot units"


@deploy("NVIDIA device nodes")
def _device_nodes(plan: Plan) -> None:
    apply_files(plan, ("devices", "userspace"), STEP, LABEL, run_step=False)


@deploy("Trial boot deadline")
def _trial_units(plan: Plan) -> None:
    apply_files(plan, "trial", STEP, LABEL, run_step=False)


@deploy("PCI mappings at boot")
def _mapping_units(plan: Plan) -> None:
    apply_files(plan, "mappings", STEP, LABEL, run_step=False)


@deploy("Boot units")
def _reload(plan: Plan) -> None:
    (step,) = [f for f in plan.follow_ups if f.name == STEP]
    follow_up(name=f"{step.command} when needed", step=step, files=plan.files)


def configure(plan: Plan) -> None:
    """The boot units of every concern, then one daemon-reload for all of them."""
    _device_nodes(plan)
    _trial_units(plan)
    _mapping_units(plan)
    _reload(plan)
