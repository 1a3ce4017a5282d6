"""pyinfra facts of :mod:`gpuhost.observe.telemetry`: per-GPU telemetry from nvidia-smi.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import telemetry


class NvidiaTelemetry(Fact, telemetry.NvidiaTelemetry, FactBase[telemetry.Telemetry]):
    """:class:`gpuhost.observe.telemetry.NvidiaTelemetry` as a pyinfra fact."""
