"""pyinfra facts of :mod:`gpuhost.observe.nvidia_driver`: the loaded NVIDIA driver and what must
match it.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import nvidia_driver


class NvidiaDriver(Fact, nvidia_driver.NvidiaDriver, FactBase[nvidia_driver.DriverVersion | None]):
    """:class:`gpuhost.observe.nvidia_driver.NvidiaDriver` as a pyinfra fact."""


class NvidiaGpuInformation(
    Fact, nvidia_driver.NvidiaGpuInformation, FactBase[dict[str, dict[str, str]]]
):
    """:class:`gpuhost.observe.nvidia_driver.NvidiaGpuInformation` as a pyinfra fact."""


class GspFirmwareFiles(Fact, nvidia_driver.GspFirmwareFiles, FactBase[dict[str, list[str]]]):
    """:class:`gpuhost.observe.nvidia_driver.GspFirmwareFiles` as a pyinfra fact."""


class NvidiaUserspace(Fact, nvidia_driver.NvidiaUserspace, FactBase[dict[str, list[str]]]):
    """:class:`gpuhost.observe.nvidia_driver.NvidiaUserspace` as a pyinfra fact."""


class NvidiaFabricManager(
    Fact, nvidia_driver.NvidiaFabricManager, FactBase[nvidia_driver.FabricManager]
):
    """:class:`gpuhost.observe.nvidia_driver.NvidiaFabricManager` as a pyinfra fact."""
