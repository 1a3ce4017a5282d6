"""pyinfra facts of :mod:`gpuhost.observe.nvidia`: NVIDIA driver and GPU facts: nvidia-smi queries, topology, P2P, /proc/driver/nvidia.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import nvidia


class NvidiaGpus(Fact, nvidia.NvidiaGpus, FactBase[nvidia.GpuQuery]):
    """:class:`gpuhost.observe.nvidia.NvidiaGpus` as a pyinfra fact."""


class NvidiaTopology(Fact, nvidia.NvidiaTopology, FactBase[nvidia.Topology | None]):
    """:class:`gpuhost.observe.nvidia.NvidiaTopology` as a pyinfra fact."""


class NvidiaP2P(Fact, nvidia.NvidiaP2P, FactBase[dict[tuple[str, str], str] | None]):
    """:class:`gpuhost.observe.nvidia.NvidiaP2P` as a pyinfra fact."""


class NvidiaDriver(Fact, nvidia.NvidiaDriver, FactBase[nvidia.DriverVersion | None]):
    """:class:`gpuhost.observe.nvidia.NvidiaDriver` as a pyinfra fact."""


class NvidiaGpuInformation(Fact, nvidia.NvidiaGpuInformation, FactBase[dict[str, dict[str, str]]]):
    """:class:`gpuhost.observe.nvidia.NvidiaGpuInformation` as a pyinfra fact."""


class GspFirmwareFiles(Fact, nvidia.GspFirmwareFiles, FactBase[dict[str, list[str]]]):
    """:class:`gpuhost.observe.nvidia.GspFirmwareFiles` as a pyinfra fact."""


class NvidiaUserspace(Fact, nvidia.NvidiaUserspace, FactBase[dict[str, list[str]]]):
    """:class:`gpuhost.observe.nvidia.NvidiaUserspace` as a pyinfra fact."""


class NvidiaFabricManager(Fact, nvidia.NvidiaFabricManager, FactBase[nvidia.FabricManager]):
    """:class:`gpuhost.observe.nvidia.NvidiaFabricManager` as a pyinfra fact."""
