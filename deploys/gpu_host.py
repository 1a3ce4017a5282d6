"""gpuhost's main deploy: `pyinfra inventory/<site>.py deploys/gpu_host.py`.

Reads the host once, prints the plan (refusing splits that cannot work before anything
changes), then applies each concern of that one Plan and reboots only if the host needs it.
The NVIDIA modules come first (only where the spec sets driver.source): a build refused for its
compiler stops the run before anything changes, and a reboot never precedes them.
"""

from pyinfra import host

from deploys import boot_cmdline, context, devices, driver, modules, reboot

plan = context.plan(host)
driver.configure(plan)
boot_cmdline.configure(plan)
modules.configure(plan)
devices.configure(plan)
reboot.reboot_if_needed(plan)
