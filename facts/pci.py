"""pyinfra facts of :mod:`gpuhost.observe.pci`: PCI devices and IOMMU groups, read straight from sysfs (no lspci needed on the host).

Each fact is its probe there, run by pyinfra.
"""

from __future__ import annotations

from pyinfra.api import FactBase

from facts._fact import Fact
from gpuhost.observe import pci


class PciDevices(Fact, pci.PciDevices, FactBase[dict[str, pci.PciDevice]]):
    """:class:`gpuhost.observe.pci.PciDevices` as a pyinfra fact."""


class IommuGroups(Fact, pci.IommuGroups, FactBase[dict[int, list[str]]]):
    """:class:`gpuhost.observe.pci.IommuGroups` as a pyinfra fact."""


class IommuDomains(Fact, pci.IommuDomains, FactBase[pci.IommuState]):
    """:class:`gpuhost.observe.pci.IommuDomains` as a pyinfra fact."""
