"""pyinfra facts of :mod:`gpuhost.observe.containers`: Facts about GPU containers: the installed pve-container, and each container's config file

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import containers


class PveContainerVersion(
    Fact, containers.PveContainerVersion, FactBase[containers.PackageVersion]
):
    """:class:`gpuhost.observe.containers.PveContainerVersion` as a pyinfra fact."""


class ContainerStates(
    Fact, containers.ContainerStates, FactBase[dict[int, containers.ContainerState]]
):
    """:class:`gpuhost.observe.containers.ContainerStates` as a pyinfra fact."""
