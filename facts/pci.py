"""PCI devices and IOMMU groups, read straight from sysfs (no lspci needed on the host)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyinfra.api import FactBase

from facts._parse import UnparsedOutput

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_FIELDS = (
    "bdf path vendor device class subsystem_vendor subsystem_device numa_node "
    "driver_override driver iommu_group"
).split()


@dataclass(frozen=True)
class PciDevice:
    bdf: str  # 0000:41:00.0
    vendor: str  # 10de
    device: str  # 2bb1
    class_code: str  # 030200 (3D controller), 060400 (PCI bridge)
    subsystem_vendor: str
    subsystem_device: str
    numa_node: int | None  # None where firmware reports -1
    driver: str | None  # driver bound now (nvidia, vfio-pci, ...), None if unbound
    driver_override: str | None  # None where sysfs shows (null)
    iommu_group: int | None  # None when the IOMMU is off
    parent: str | None  # BDF of the upstream bridge / root port, None under a host bridge
    path: str  # resolved /sys/devices/... path

    @property
    def vendor_device(self) -> str:
        return f"{self.vendor}:{self.device}"

    @property
    def is_gpu(self) -> bool:
        # 0300 VGA compatible controller, 0302 3D controller
        return self.vendor == "10de" and self.class_code[:4] in ("0300", "0302")

    @property
    def is_bridge(self) -> bool:
        return self.class_code[:4] == "0604"


def _hex(value: str) -> str:
    return value.removeprefix("0x").lower()


def parse_pci_devices(lines: list[str]) -> dict[str, PciDevice]:
    devices: dict[str, PciDevice] = {}
    for line in lines:
        if not line.strip():
            continue
        fields = dict(item.partition("=")[::2] for item in line.split(" "))
        if list(fields) != _FIELDS or not _BDF.match(fields["bdf"]):
            raise UnparsedOutput("PCI devices", line)
        parent = fields["path"].rstrip("/").split("/")[-2]
        numa = int(fields["numa_node"]) if fields["numa_node"] not in ("-", "") else -1
        group = fields["iommu_group"]
        devices[fields["bdf"]] = PciDevice(
            bdf=fields["bdf"],
            vendor=_hex(fields["vendor"]),
            device=_hex(fields["device"]),
            class_code=_hex(fields["class"]),
            subsystem_vendor=_hex(fields["subsystem_vendor"]),
            subsystem_device=_hex(fields["subsystem_device"]),
            numa_node=None if numa < 0 else numa,
            driver=fields["driver"] or None,
            driver_override=None
            if fields["driver_override"] in ("(null)", "-")
            else (fields["driver_override"]),
            iommu_group=int(group) if group else None,
            parent=parent if _BDF.match(parent) else None,
            path=fields["path"],
        )
    return devices


class PciDevices(FactBase[dict[str, PciDevice]]):
    """
    Returns every PCI device by BDF, with ids, class, bound driver, driver_override,
    IOMMU group, NUMA node and parent bridge, read from ``/sys/bus/pci/devices``.

    .. code:: python

        {"0000:41:00.0": PciDevice(bdf="0000:41:00.0", vendor="10de", device="2bb1",
                                   driver="nvidia", iommu_group=42, numa_node=0, ...)}
    """

    default = dict

    def command(self) -> str:
        return r"""for d in /sys/bus/pci/devices/*; do
  printf "bdf=%s path=%s" "${d##*/}" "$(readlink -f "$d")"
  for a in vendor device class subsystem_vendor subsystem_device numa_node driver_override; do
    v=$(cat "$d/$a" 2>/dev/null); printf " %s=%s" "$a" "${v:--}"
  done
  drv=$(readlink "$d/driver" 2>/dev/null); grp=$(readlink "$d/iommu_group" 2>/dev/null)
  printf " driver=%s iommu_group=%s\n" "${drv##*/}" "${grp##*/}"
done"""

    def process(self, output: list[str]) -> dict[str, PciDevice]:
        return parse_pci_devices(output)


def parse_iommu_groups(lines: list[str]) -> dict[int, list[str]]:
    groups: dict[int, list[str]] = {}
    for line in lines:
        if not line.strip():
            continue
        number, *members = line.split()
        if not number.isdigit() or not all(_BDF.match(m) for m in members):
            raise UnparsedOutput("IOMMU groups", line)
        groups[int(number)] = sorted(members)
    return groups


class IommuGroups(FactBase[dict[int, list[str]]]):
    """
    Returns IOMMU group number -> member BDFs from ``/sys/kernel/iommu_groups``; empty when
    the IOMMU is off (or not exposed, as inside a VM without a vIOMMU).
    """

    default = dict

    def command(self) -> str:
        return (
            'for g in /sys/kernel/iommu_groups/*; do [ -d "$g" ] || continue; '
            'printf "%s" "${g##*/}"; for d in "$g"/devices/*; do printf " %s" "${d##*/}"; done; '
            "echo; done"
        )

    def process(self, output: list[str]) -> dict[int, list[str]]:
        return parse_iommu_groups(output)
