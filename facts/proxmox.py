"""pyinfra facts of :mod:`gpuhost.observe.proxmox`: Proxmox VE facts: proxmox-boot-tool state and the guest configs under /etc/pve.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import proxmox


class BootTool(Fact, proxmox.BootTool, FactBase[proxmox.BootToolStatus | None]):
    """:class:`gpuhost.observe.proxmox.BootTool` as a pyinfra fact."""


class BootKernelList(Fact, proxmox.BootKernelList, FactBase[proxmox.BootKernels | None]):
    """:class:`gpuhost.observe.proxmox.BootKernelList` as a pyinfra fact."""


class PveGuestConfigs(
    Fact, proxmox.PveGuestConfigs, FactBase[dict[tuple[str, int], proxmox.GuestConfig]]
):
    """:class:`gpuhost.observe.proxmox.PveGuestConfigs` as a pyinfra fact."""
