"""pyinfra facts of :mod:`gpuhost.observe.devices`: Device nodes as they are on a host or in a guest: the nodes CUDA opens and their numbers.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import devices


class NvidiaDeviceNodes(Fact, devices.NvidiaDeviceNodes, FactBase[dict[str, devices.DeviceNode]]):
    """:class:`gpuhost.observe.devices.NvidiaDeviceNodes` as a pyinfra fact."""
