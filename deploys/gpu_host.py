"""gpuhost's main deploy: `pyinfra inventory/<site>.py deploys/gpu_host.py`.

Reads the host once, prints the plan (refusing splits that cannot work before anything
changes), then applies each concern and reboots only if something needs it.
"""

from deploys import boot_cmdline, context, modules, reboot

ctx = context.load()
boot_cmdline.configure(ctx)
modules.configure(ctx)
reboot.reboot_if_needed(ctx)
