"""pyinfra facts of :mod:`gpuhost.observe.storage`: Health of ZFS pools and Proxmox storages, for the audit and the trial gate.

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import storage


class StorageHealthFact(Fact, storage.StorageHealthFact, FactBase[storage.StorageHealth]):
    """:class:`gpuhost.observe.storage.StorageHealthFact` as a pyinfra fact."""
