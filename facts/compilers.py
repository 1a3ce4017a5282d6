"""pyinfra facts of :mod:`gpuhost.observe.compilers`: Which compiler built each installed kernel, and which compilers the host has.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import compilers


class KernelCompilers(Fact, compilers.KernelCompilers, FactBase[compilers.CompilerInventory]):
    """:class:`gpuhost.observe.compilers.KernelCompilers` as a pyinfra fact."""
