"""gpuhost's main deploy: `pyinfra inventory/<site>.py deploys/gpu_host.py`.

Reads the host once, prints the plan (refusing splits that cannot work, and trial boots that
cannot be made safe, before anything changes), then applies each concern of that one Plan. A new
kernel is booted once through a true one-shot and pinned only after the audit's host checks pass
on it (deploys/trial_boot.py); otherwise the host reboots only if it needs to.
The kernel (from apt or the artifact store) is installed after the running one is pinned, then
the NVIDIA modules for it (only where the spec sets driver.source): a store without the kernel,
or a module build refused for its compiler, stops the run before anything changes, and a reboot
never precedes them. With driver.source.installer the userspace and GSP firmware of the same
version follow (deploys/userspace.py), still before any reboot. With monitoring.enabled the
metrics timer and node_exporter come last (deploys/monitoring.py).
"""

# ruff: noqa: E402
from pyinfra import host

from deploys import prefetch

# The host reads itself while the rest of this deploy is imported (deploys/prefetch.py): the
# imports below come after a statement on purpose.
prefetch.start(host)

from deploys import (
    boot_cmdline,
    containers,
    context,
    devices,
    driver,
    kernel,
    modules,
    monitoring,
    readiness,
    reboot,
    rollout,
    split,
    trial_boot,
    userspace,
    vfio,
    vms,
)
from gpuhost.plan.trial.state import Step
from gpuhost.spec.inventory import GUEST_KEY


def provision() -> None:
    plan = context.plan(host)
    context.refuse_unmet(plan, host)  # the token, driver files, stores: before any change
    trial_boot.preflight(plan)
    for _turn in rollout.turns(host):  # one host after another across a fleet: deploys/rollout.py
        moving = split.moving(plan)  # GPUs move live (no reboot in this run): deploys/split.py
        if moving is not None:
            split.release(moving)
        trial_boot.before_install(name="Room for a new kernel; pin the running one", plan=plan)
        new_kernel = kernel.configure(plan)
        driver.configure(plan, new_kernel.compiler if new_kernel is not None else None)
        userspace.configure(plan)  # before any reboot: the open module needs its GSP firmware
        boot_cmdline.configure(plan)
        vfio.configure(plan, live=not plan.rebooting)  # before modules: one initramfs rebuild
        modules.configure(plan)
        devices.configure(plan)
        vms.configure(plan)
        readiness.configure(plan)  # hookscripts before any guest this run starts
        if plan.trial_step is Step.CONVERGED:
            reboot.reboot_if_needed(plan)
        else:  # the trial's reboot applies everything above too, and its gate checks it
            trial_boot.trial(plan)
        if plan.rebooting:  # without a reboot the groups are the running kernel's: nothing to do
            # The IOMMU groups are the new kernel's now: the guests started above already had
            # their mappings refreshed (deploys/guests.py); this is for the VMs not running.
            vms.refresh_mappings(name="PCI mappings: the IOMMU groups after the reboot", plan=plan)
        containers.configure(plan)  # after any reboot: raw rules need that boot's majors
        readiness.start_held_guests(plan)  # the guests the readiness check held back, fixed now
        if moving is not None:
            split.restore(moving)
        monitoring.configure(plan)  # last: its one run audits what the run left


if host.data.get(GUEST_KEY) is None:  # guest hosts (gpuhost.pve.guests) are not GPU hosts
    provision()
