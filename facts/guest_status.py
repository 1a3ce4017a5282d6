"""pyinfra facts of :mod:`gpuhost.observe.guest_status`: which guests run on this node.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import guest_status


class GuestStatuses(Fact, guest_status.GuestStatuses, FactBase[dict[tuple[str, int], str]]):
    """:class:`gpuhost.observe.guest_status.GuestStatuses` as a pyinfra fact."""
