"""gpuhost's main deploy: `pyinfra inventory/<site>.py deploys/gpu_host.py`.

Reads the host once, prints the plan (refusing splits that cannot work before anything
changes), then applies each concern of that one Plan and reboots only if the host needs it.
"""

from pyinfra import host

from deploys import boot_cmdline, context, devices, modules, reboot

plan = context.plan(host)
boot_cmdline.configure(plan)
modules.configure(plan)
devices.configure(plan)
reboot.reboot_if_needed(plan)
