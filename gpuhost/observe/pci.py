"""PCI devices and IOMMU groups, read straight from sysfs (no lspci needed on the host)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe

_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ATTRS = (
    "vendor",
    "device",
    "class",
    "subsystem_vendor",
    "subsystem_device",
    "numa_node",
    "driver_override",
)
_SYS = "/sys/bus/pci/devices"
_DEV = re.compile(r"^dev (?P<bdf>\S+) (?P<target>\S+)$")
# A driver's name may hold spaces: its sysfs directory is the pci_driver's .name (i6300esb's is
# "i6300ESB timer", drivers/watchdog/i6300esb.c ESB_MODULE_NAME), so the link target runs to the
# end of the line (tests/fixtures/captures/vm-q35).
_LINK = re.compile(
    rf"^link {_SYS}/(?P<bdf>[^/\s]+)/? (?P<name>driver|iommu_group) (?P<target>\S.*)$"
)
_ATTR = re.compile(rf"^{_SYS}/(?P<bdf>[^/]+)/(?P<attr>{'|'.join(_ATTRS)}):(?P<value>.*)$")


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
    path: str  # sysfs link target, ../../../devices/pci0000:40/0000:40:01.1/0000:41:00.0

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
    """Parse the three listings of :class:`PciDevices` (device links, driver/group links, attributes)."""
    paths: dict[str, str] = {}
    links: dict[str, dict[str, str]] = {}
    attrs: dict[str, dict[str, str]] = {}
    for line in lines:
        if not line.strip():
            continue
        if m := _DEV.match(line):
            paths[m["bdf"]] = m["target"]
        elif m := _LINK.match(line):
            links.setdefault(m["bdf"], {})[m["name"]] = m["target"].rsplit("/", 1)[-1]
        elif m := _ATTR.match(line):
            attrs.setdefault(m["bdf"], {})[m["attr"]] = m["value"].strip()
        else:
            raise UnparsedOutput("PCI devices", line)
    devices: dict[str, PciDevice] = {}
    for bdf, target in sorted(paths.items()):
        a, link = attrs.get(bdf, {}), links.get(bdf, {})
        if not _BDF.match(bdf) or not all(k in a for k in ("vendor", "device", "class")):
            raise UnparsedOutput("PCI devices", f"dev {bdf} {target}", "device without its ids")
        parent = target.rstrip("/").split("/")[-2]
        numa = int(a.get("numa_node") or -1)
        override = a.get("driver_override")
        group = link.get("iommu_group")
        devices[bdf] = PciDevice(
            bdf=bdf,
            vendor=_hex(a["vendor"]),
            device=_hex(a["device"]),
            class_code=_hex(a["class"]),
            subsystem_vendor=_hex(a.get("subsystem_vendor", "")),
            subsystem_device=_hex(a.get("subsystem_device", "")),
            numa_node=None if numa < 0 else numa,
            driver=link.get("driver"),
            driver_override=None if override in (None, "", "(null)") else override,
            iommu_group=int(group) if group else None,
            parent=parent if _BDF.match(parent) else None,
            path=target,
        )
    return devices


def nvswitches(pci: dict[str, PciDevice]) -> list[str]:
    """BDFs of the NVSwitches on the bus (NVIDIA, class 0680xx "other bridge"): boards with them
    need nvidia-fabricmanager before CUDA starts."""
    return [d.bdf for d in pci.values() if d.vendor == "10de" and d.class_code.startswith("0680")]


class PciDevices(Probe[dict[str, PciDevice]]):
    """
    Returns every PCI device by BDF, with ids, class, bound driver, driver_override,
    IOMMU group, NUMA node and parent bridge, read from ``/sys/bus/pci/devices``.

    .. code:: python

        {"0000:41:00.0": PciDevice(bdf="0000:41:00.0", vendor="10de", device="2bb1",
                                   driver="nvidia", iommu_group=42, numa_node=0, ...)}
    """

    default = dict

    def command(self) -> str:
        # Three processes for the whole bus: a loop of cat/readlink per device costs ~10 forks
        # per device, which is most of a converged run on a host with a few hundred devices.
        attrs = " ".join(f"{_SYS}/*/{a}" for a in _ATTRS)
        return (
            f"find {_SYS}/ -mindepth 1 -maxdepth 1 -printf 'dev %f %l\\n'; "
            f"find {_SYS}/*/ -maxdepth 1 \\( -name driver -o -name iommu_group \\) "
            "-printf 'link %h %f %l\\n'; "
            f"grep -H '' {attrs} 2>/dev/null; true"
        )

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


class IommuGroups(Probe[dict[int, list[str]]]):
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


# Values of /sys/kernel/iommu_groups/<n>/type (drivers/iommu/iommu.c, iommu_group_show_type):
# the group's default domain. "identity" is iommu=pt's untranslated DMA; "DMA" and "DMA-FQ"
# translate (FQ: lazy, batched IOTLB flushes); "unknown" when the group has no default domain.
IOMMU_DOMAIN_TYPES = ("identity", "DMA", "DMA-FQ", "blocked", "unmanaged", "unknown")
_GROUP_TYPE = re.compile(r"^/sys/kernel/iommu_groups/(?P<group>\d+)/type:(?P<type>.*)$")


@dataclass(frozen=True)
class IommuState:
    """The running IOMMU: its hardware units and each group's default domain type."""

    units: tuple[str, ...] = ()  # /sys/class/iommu entries: dmar0, ivhd0, ...
    group_types: dict[int, str] = field(default_factory=dict)  # group -> "DMA-FQ" | ...

    @property
    def active(self) -> bool:
        return bool(self.units or self.group_types)

    @property
    def translated(self) -> bool:
        """Some group's default domain translates DMA (no iommu=pt in effect for it)."""
        return any(t in ("DMA", "DMA-FQ") for t in self.group_types.values())


def parse_iommu_state(lines: list[str]) -> IommuState:
    units: list[str] = []
    types: dict[int, str] = {}
    for line in lines:
        if not line.strip():
            continue
        if match := _GROUP_TYPE.match(line):
            if match["type"] not in IOMMU_DOMAIN_TYPES:
                raise UnparsedOutput("IOMMU group types", line, "unknown domain type")
            types[int(match["group"])] = match["type"]
        elif line.startswith("iommu ") and re.fullmatch(r"[\w.:-]+", line[6:]):
            units.append(line[6:])
        else:
            raise UnparsedOutput("IOMMU state", line)
    return IommuState(units=tuple(sorted(units)), group_types=types)


class IommuDomains(Probe[IommuState]):
    """
    Returns the IOMMU hardware units (``/sys/class/iommu``) and each IOMMU group's default
    domain type (``/sys/kernel/iommu_groups/*/type``: identity, DMA, DMA-FQ, ...); empty when
    the IOMMU is off or not exposed.
    """

    default = IommuState

    def command(self) -> str:
        return (
            "grep -H . /sys/kernel/iommu_groups/*/type 2>/dev/null; "
            'for i in /sys/class/iommu/*; do [ -e "$i" ] && echo "iommu ${i##*/}"; done; true'
        )

    def process(self, output: list[str]) -> IommuState:
        return parse_iommu_state(output)
