"""pyinfra facts of :mod:`gpuhost.observe.monitoring`: the metrics timer's runtime, node_exporter and the metrics file's age.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import monitoring


class MonitoringStateFact(
    Fact, monitoring.MonitoringStateFact, FactBase[monitoring.MonitoringState]
):
    """:class:`gpuhost.observe.monitoring.MonitoringStateFact` as a pyinfra fact."""
