"""Proxmox VE facts: proxmox-boot-tool state and the guest configs under /etc/pve."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuhost.observe.parse import UnparsedOutput, split_status, with_status
from gpuhost.observe.probe import Probe

# --- proxmox-boot-tool status --------------------------------------------------------------------

_ESP = re.compile(
    r"^(?P<uuid>[0-9A-Fa-f-]+) is configured with: (?P<mode>uefi|grub) "
    r"\(versions: (?P<versions>.*)\)$"
)


@dataclass(frozen=True)
class BootToolStatus:
    configured: bool  # False: /etc/kernel/proxmox-boot-uuids missing (plain GRUB host)
    booted_with: str | None  # "uefi" | "legacy bios"
    esps: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (uuid, mode, kernels)

    @property
    def loader(self) -> str:
        """systemd-boot when any ESP is set up for uefi, else grub (from /etc/default/grub)."""
        return "systemd-boot" if any(mode == "uefi" for _, mode, _ in self.esps) else "grub"


def parse_boot_tool_status(lines: list[str]) -> BootToolStatus:
    lines, status = split_status(lines, "proxmox-boot-tool status")
    booted = None
    esps = []
    for line in lines:
        if not line.strip() or line.startswith(("Re-executing ", "WARN: ")):
            continue
        if line.startswith("E: ") and "proxmox-boot-uuids does not exist" in line:
            return BootToolStatus(configured=False, booted_with=booted)
        if line.startswith("System currently booted with "):
            booted = line.removeprefix("System currently booted with ")
            continue
        esp = _ESP.match(line)
        if not esp:
            raise UnparsedOutput("proxmox-boot-tool status", line)
        esps.append((esp["uuid"], esp["mode"], esp["versions"].split(", ")))
    if status != 0:
        last = lines[-1] if lines else ""
        raise UnparsedOutput("proxmox-boot-tool status", last, f"exit {status}")
    return BootToolStatus(configured=True, booted_with=booted, esps=esps)


class BootTool(Probe["BootToolStatus | None"]):
    """
    Returns ``proxmox-boot-tool status``: whether ESPs are managed, how the system booted and
    which loader (systemd-boot or grub) each ESP carries. None where the tool is absent.
    """

    requires_command = "proxmox-boot-tool"

    def command(self) -> str:
        return with_status("proxmox-boot-tool status")

    def process(self, output: list[str]) -> BootToolStatus:
        return parse_boot_tool_status(output)


# --- proxmox-boot-tool kernel list ----------------------------------------------------------------

_KERNEL_SECTIONS = {
    "Manually selected kernels:": "manual",
    "Automatically selected kernels:": "automatic",
    "Pinned kernel:": "pinned",
    "Kernel pinned on next-boot:": "next_boot",
}


@dataclass(frozen=True)
class BootKernels:
    manual: list[str]
    automatic: list[str]
    pinned: str | None
    next_boot: str | None

    @property
    def all(self) -> list[str]:
        return sorted(set(self.manual) | set(self.automatic))


def parse_kernel_list(lines: list[str]) -> BootKernels:
    found: dict[str, list[str]] = {key: [] for key in _KERNEL_SECTIONS.values()}
    section = None
    for line in lines:
        line = line.strip()
        if not line or line == "None.":
            continue
        if line in _KERNEL_SECTIONS:
            section = _KERNEL_SECTIONS[line]
        elif section and re.fullmatch(r"\d+\.\d+[\w.+~-]*", line):
            found[section].append(line)
        else:
            raise UnparsedOutput("proxmox-boot-tool kernel list", line)
    return BootKernels(
        manual=found["manual"],
        automatic=found["automatic"],
        pinned=(found["pinned"] or [None])[0],
        next_boot=(found["next_boot"] or [None])[0],
    )


class BootKernelList(Probe["BootKernels | None"]):
    """Returns ``proxmox-boot-tool kernel list``: selected kernels, pin and next-boot pin."""

    requires_command = "proxmox-boot-tool"

    def command(self) -> str:
        return "proxmox-boot-tool kernel list"

    def process(self, output: list[str]) -> BootKernels:
        return parse_kernel_list(output)


# --- /etc/pve guest configs --------------------------------------------------------------------

_KEY = re.compile(r"^(?P<key>[a-z][a-z_]*\d*):\s*(?P<value>.+?)\s*$")
_RAW = re.compile(r"^(?P<key>lxc\.[a-z0-9_\-.]+)(?::|\s*=)\s*(?P<value>.*?)\s*$")
# [pve:pending] (containers), [PENDING] and [special:cloudinit] (VMs), [snapshot-name]
_SECTION = re.compile(r"^\[(?P<name>[a-z][a-z0-9_\-]+|pve:pending|PENDING|special:cloudinit)\]\s*$")
_CONF_HEADER = re.compile(r"^==> /etc/pve/(?P<kind>lxc|qemu-server)/(?P<id>\d+)\.conf <==$")


@dataclass
class PveConfig:
    """One section of a Proxmox guest config: options, raw lxc.* pairs, description."""

    options: dict[str, str] = field(default_factory=dict)
    raw: list[tuple[str, str]] = field(default_factory=list)  # lxc.* keys, in file order
    description: list[str] = field(default_factory=list)


@dataclass
class GuestConfig:
    kind: str  # "lxc" | "qemu"
    vmid: int
    current: PveConfig
    pending: PveConfig | None = None
    snapshots: dict[str, PveConfig] = field(default_factory=dict)


def parse_pve_config(lines: list[str], kind: str, vmid: int) -> GuestConfig:
    """Parse /etc/pve/lxc/<ctid>.conf or /etc/pve/qemu-server/<vmid>.conf (PVE 8 format)."""
    guest = GuestConfig(kind=kind, vmid=vmid, current=PveConfig())
    section = guest.current
    for line in lines:
        if not line.strip():
            continue
        if line.startswith("#"):
            section.description.append(line[1:])
            continue
        header = _SECTION.match(line)
        if header:
            section = PveConfig()
            if header["name"] in ("pve:pending", "PENDING"):
                guest.pending = section
            else:
                guest.snapshots[header["name"]] = section
            continue
        raw = _RAW.match(line) if kind == "lxc" else None
        if raw:
            section.raw.append((raw["key"], raw["value"]))
            continue
        option = _KEY.match(line)
        if not option:
            raise UnparsedOutput(f"/etc/pve {kind} config {vmid}", line)
        section.options[option["key"]] = option["value"]
    return guest


def parse_pve_configs(lines: list[str]) -> dict[tuple[str, int], GuestConfig]:
    configs: dict[tuple[str, int], GuestConfig] = {}
    chunk: list[str] = []
    key: tuple[str, int] | None = None

    def flush() -> None:
        if key:
            configs[key] = parse_pve_config(chunk, *key)

    for line in lines:
        header = _CONF_HEADER.match(line)
        if header:
            flush()
            kind = "lxc" if header["kind"] == "lxc" else "qemu"
            key, chunk = (kind, int(header["id"])), []
        elif key is None:
            if line.strip():
                raise UnparsedOutput("/etc/pve guest configs", line, "line before any file header")
        else:
            chunk.append(line)
    flush()
    return configs


class PveGuestConfigs(Probe[dict[tuple[str, int], GuestConfig]]):
    """
    Returns every container and VM config on this node from /etc/pve:
    ``{("lxc", 200): GuestConfig(...), ("qemu", 129): GuestConfig(...)}``.
    """

    default = dict

    def command(self) -> str:
        return (
            "for f in /etc/pve/lxc/*.conf /etc/pve/qemu-server/*.conf; do "
            '[ -f "$f" ] || continue; echo "==> $f <=="; cat "$f"; done'
        )

    def process(self, output: list[str]) -> dict[tuple[str, int], GuestConfig]:
        return parse_pve_configs(output)


# --- /etc/pve/mapping/pci.cfg: cluster PCI resource mappings ---------------------------------------

MAPPINGS_FILE = "/etc/pve/mapping/pci.cfg"
_MAPPING_HEADER = re.compile(r"^(?P<id>[a-z][a-z0-9_-]*)\s*$")
_MAPPING_KEY = re.compile(r"^\t(?P<key>map|description|mdev|live-migration-capable) (?P<value>.*)$")


@dataclass(frozen=True)
class PciMappingConfig:
    id: str
    maps: tuple[str, ...] = ()  # `map` property strings, one per node
    description: str | None = None


def parse_pci_mappings(text: str) -> dict[str, PciMappingConfig]:
    """pmxcfs section config (pve-guest-common PVE/Mapping/PCI.pm): an id line, then
    tab-indented ``key value`` lines; `map` repeats, once per node."""
    found: dict[str, PciMappingConfig] = {}
    current: dict | None = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        header = _MAPPING_HEADER.match(line)
        if header:
            current = {"id": header["id"], "maps": [], "description": None}
            found[header["id"]] = current  # type: ignore[assignment]
            continue
        item = _MAPPING_KEY.match(line)
        if item is None or current is None:
            raise UnparsedOutput("/etc/pve/mapping/pci.cfg", line)
        if item["key"] == "map":
            current["maps"].append(item["value"].strip())
        elif item["key"] == "description":
            current["description"] = item["value"]
    return {
        k: PciMappingConfig(v["id"], tuple(v["maps"]), v["description"])  # type: ignore[index]
        for k, v in found.items()
    }
