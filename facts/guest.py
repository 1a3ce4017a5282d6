"""pyinfra facts of :mod:`gpuhost.observe.guest`: What a workload in a guest starts with: the environment of a login shell.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import guest


class LoginEnvironment(Fact, guest.LoginEnvironment, FactBase[dict[str, str]]):
    """:class:`gpuhost.observe.guest.LoginEnvironment` as a pyinfra fact."""
