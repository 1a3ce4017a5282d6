"""pyinfra facts of :mod:`gpuhost.observe.boot`: The boot path a trial boot depends on: firmware, boot loader variables, ESPs, grubenv, room.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import boot


class BootPath(Fact, boot.BootPath, FactBase[boot.BootPathInfo]):
    """:class:`gpuhost.observe.boot.BootPath` as a pyinfra fact."""
