"""pyinfra facts of :mod:`gpuhost.observe.rebind`: What a live rebind of one board must know: each function's driver, override, IOMMU group,

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import rebind


class BoardBinding(Fact, rebind.BoardBinding, FactBase[rebind.BoardState]):
    """:class:`gpuhost.observe.rebind.BoardBinding` as a pyinfra fact."""
