"""pyinfra facts of :mod:`gpuhost.observe.cuda`: CUDA as a workload sees it: the driver API probe (gpuhost/probes/cuda_probe.py) run remotely.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import cuda


class CudaProbe(Fact, cuda.CudaProbe, FactBase[cuda.CudaView | None]):
    """:class:`gpuhost.observe.cuda.CudaProbe` as a pyinfra fact."""
