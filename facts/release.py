"""pyinfra facts of :mod:`gpuhost.observe.release`: Which Debian and which Proxmox VE release the host runs: /etc/os-release and pve-manager.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import release


class HostReleaseFact(Fact, release.HostReleaseFact, FactBase[release.HostRelease]):
    """:class:`gpuhost.observe.release.HostReleaseFact` as a pyinfra fact."""
