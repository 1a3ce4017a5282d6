"""pyinfra facts of :mod:`gpuhost.observe.nvidia`: the GPUs as nvidia-smi shows them.

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
