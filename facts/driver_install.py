"""pyinfra facts of :mod:`gpuhost.observe.driver_install`: What the NVIDIA driver deploys compare against: the installed modules' hashes, what a build

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import driver_install


class ModuleHashes(Fact, driver_install.ModuleHashes, FactBase[dict[str, str]]):
    """:class:`gpuhost.observe.driver_install.ModuleHashes` as a pyinfra fact."""


class BuildResources(Fact, driver_install.BuildResources, FactBase[tuple[int, int]]):
    """:class:`gpuhost.observe.driver_install.BuildResources` as a pyinfra fact."""


class DriverUserspace(
    Fact, driver_install.DriverUserspace, FactBase[driver_install.UserspaceState]
):
    """:class:`gpuhost.observe.driver_install.DriverUserspace` as a pyinfra fact."""
