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

from deploys.ops import apply_items, as_planned, files_as_planned, follow_up, settled_with
from gpuhost.plan.make import Plan

STEP = "systemd"  # the follow-up every unit file here triggers: systemctl daemon-reload
LABEL = "Boot units"
# Each concern's heading, for the files it changes in this run; the files already as planned
# are reported together, in one operation (pyinfra inspects the call stack for every one).
CONCERNS = {
    "NVIDIA device nodes": ("devices", "userspace"),
    "Trial boot deadline": ("trial",),
    "PCI mappings at boot": ("mappings",),
}


def _changes(plan: Plan, concerns: tuple[str, ...]) -> None:
    items = [i for i in plan.files.values() if i.concern in concerns and not as_planned(i)]
    apply_items(items, LABEL, [f for f in plan.follow_ups if f.name == STEP])


@deploy(LABEL)
def _settled(paths: list[str], more: str = "") -> None:
    files_as_planned(name=f"{LABEL}: {len(paths)} file(s) as planned{more}", paths=paths)


@deploy(LABEL)
def _reload(plan: Plan) -> None:
    (step,) = [f for f in plan.follow_ups if f.name == STEP]
    follow_up(name=f"{step.command} when needed", step=step, files=plan.files)


def configure(plan: Plan) -> None:
    """The boot units of every concern, then one daemon-reload for all of them."""
    concerns = {c for cs in CONCERNS.values() for c in cs}
    items = [item for item in plan.files.values() if item.concern in concerns]
    (step,) = [f for f in plan.follow_ups if f.name == STEP]
    if settled_with(items, step, plan.files):
        paths = [item.path for item in items]
        _settled(paths, f", {step.command}: nothing pending")
        return
    settled = [item.path for item in items if as_planned(item)]
    if settled:
        _settled(settled)
    for heading, of in CONCERNS.items():
        if any(item.concern in of and item.path not in settled for item in items):
            deploy(heading)(_changes)(plan, of)
    _reload(plan)
