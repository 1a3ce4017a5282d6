"""Kernel command line: the Plan's boot loader files, then the loader refresh they need.

systemd-boot hosts (proxmox-boot-tool, uefi ESPs) read /etc/kernel/cmdline; GRUB hosts get
gpuhost's drop-in /etc/default/grub.d/gpuhost.cfg (see gpuhost/bootconf.py). The refresh runs
when the files change, or when an earlier run changed them and did not get to refresh.
"""

from __future__ import annotations

from pyinfra.api import deploy

from deploys.ops import apply_files
from gpuhost.plan import Plan


@deploy("Kernel command line")
def configure(plan: Plan) -> None:
    apply_files(plan, "cmdline", "loader", "Kernel parameters")
