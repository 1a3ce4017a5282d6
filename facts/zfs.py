"""pyinfra facts of :mod:`gpuhost.observe.zfs`: How the host uses ZFS, and what each installed kernel carries (gpuhost/build/features.py).

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import zfs


class ZfsUsage(Fact, zfs.ZfsUsage, FactBase[zfs.ZfsUse]):
    """:class:`gpuhost.observe.zfs.ZfsUsage` as a pyinfra fact."""


class KernelFeatureFiles(Fact, zfs.KernelFeatureFiles, FactBase[zfs.InstalledKernelFeatures]):
    """:class:`gpuhost.observe.zfs.KernelFeatureFiles` as a pyinfra fact."""
