"""pyinfra facts of :mod:`gpuhost.observe.snapshot`: Several facts in one round trip.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import snapshot


class Combined(Fact, snapshot.Combined, FactBase[dict[str, tuple[int, list[str]]]]):
    """:class:`gpuhost.observe.snapshot.Combined` as a pyinfra fact."""
