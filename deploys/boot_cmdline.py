"""Kernel command line: the Plan's boot loader files, then the loader refresh they need.

systemd-boot hosts (proxmox-boot-tool, uefi ESPs) read /etc/kernel/cmdline; GRUB hosts get
gpuhost's drop-in /etc/default/grub.d/gpuhost.cfg (see gpuhost/bootconf.py). The refresh runs
when the files change, or when an earlier run changed them and did not get to refresh.
"""

from __future__ import annotations

from pyinfra.api import deploy

from deploys.ops import follow_up, managed_file
from gpuhost.plan import Plan


@deploy("Kernel command line")
def configure(plan: Plan) -> None:
    loader = next(f for f in plan.follow_ups if f.name == "loader")
    for item in plan.files.values():
        if item.concern == "cmdline":
            managed_file(name=f"Kernel parameters: {item.path}", item=item, follow_ups=[loader])
    follow_up(
        name=f"Write the boot loader configuration ({loader.command})",
        step=loader,
        files=plan.files,
    )
