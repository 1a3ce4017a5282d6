"""NVIDIA driver and GPU facts: nvidia-smi queries, topology, P2P, /proc/driver/nvidia."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field

from gpuhost.observe.parse import (
    UnparsedOutput,
    normalize_bdf,
    split_status,
    strip_ansi,
    with_status,
)
from gpuhost.observe.probe import Probe

# --- nvidia-smi --query-gpu -------------------------------------------------------------------

QUERY_FIELDS = (
    "index,pci.bus_id,name,uuid,driver_version,memory.total,compute_cap,persistence_mode,"
    "vbios_version,pci.device_id"
)


@dataclass(frozen=True)
class Gpu:
    index: int
    bdf: str  # sysfs form, 0000:41:00.0
    name: str
    uuid: str
    driver_version: str
    memory_mib: int
    compute_cap: str  # "12.0" (Blackwell RTX PRO), "9.0" (Hopper)
    persistence_mode: bool
    vbios: str
    vendor_device: str  # 10de:2bb1


@dataclass(frozen=True)
class GpuQuery:
    """What ``nvidia-smi --query-gpu`` says: the GPUs, or why it could not answer."""

    gpus: list[Gpu] = field(default_factory=list)
    error: str | None = None  # e.g. "NVIDIA-SMI has failed because it couldn't communicate..."


def _device_id(value: str) -> str:
    # nvidia-smi prints PCI device id as 0x<device><vendor>, e.g. 0x233510DE
    raw = value.lower().removeprefix("0x")
    if len(raw) != 8:
        raise ValueError(value)
    return f"{raw[4:]}:{raw[:4]}"


def parse_gpu_query(lines: list[str]) -> GpuQuery:
    lines, status = split_status(lines, "nvidia-smi --query-gpu")
    if status != 0:
        return GpuQuery(error="\n".join(line for line in lines if line.strip()) or f"exit {status}")
    rows = list(csv.reader(lines, skipinitialspace=True))
    if not rows:
        return GpuQuery()
    header = [cell.split(" [")[0] for cell in rows[0]]  # "memory.total [MiB]" -> "memory.total"
    if header != QUERY_FIELDS.split(","):
        raise UnparsedOutput("nvidia-smi --query-gpu", lines[0], "unexpected header")
    gpus = []
    for line, row in zip(lines[1:], rows[1:], strict=True):
        if len(row) != len(header):
            raise UnparsedOutput("nvidia-smi --query-gpu", line)
        cell = dict(zip(header, row, strict=True))
        try:
            gpus.append(
                Gpu(
                    index=int(cell["index"]),
                    bdf=normalize_bdf(cell["pci.bus_id"]),
                    name=cell["name"],
                    uuid=cell["uuid"],
                    driver_version=cell["driver_version"],
                    memory_mib=int(cell["memory.total"]),
                    compute_cap=cell["compute_cap"],
                    persistence_mode=cell["persistence_mode"] == "Enabled",
                    vbios=cell["vbios_version"],
                    vendor_device=_device_id(cell["pci.device_id"]),
                )
            )
        except ValueError as exc:
            raise UnparsedOutput("nvidia-smi --query-gpu", line, f"bad value {exc}") from exc
    return GpuQuery(gpus=gpus)


class NvidiaGpus(Probe[GpuQuery]):
    """
    Returns the GPUs as nvidia-smi sees them (index, BDF, name, UUID, driver version, memory,
    compute capability, persistence mode), or the error nvidia-smi gave (no driver loaded).
    """

    requires_command = "nvidia-smi"

    @staticmethod
    def default() -> GpuQuery:
        return GpuQuery(error="nvidia-smi is not installed")

    def command(self) -> str:
        return with_status(f"nvidia-smi --query-gpu={QUERY_FIELDS} --format=csv,nounits")

    def process(self, output: list[str]) -> GpuQuery:
        return parse_gpu_query(output)


# --- nvidia-smi topo -m -----------------------------------------------------------------------

_LINK = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV\d+)$")


@dataclass(frozen=True)
class Topology:
    """The ``nvidia-smi topo -m`` matrix: links between devices and each GPU's affinity."""

    devices: list[str]  # GPU0, GPU1, ..., NIC0, ...
    links: dict[tuple[str, str], str]  # (GPU0, GPU1) -> "NV18" | "SYS" | ...
    cpu_affinity: dict[str, str]  # GPU0 -> "0-31"
    numa_affinity: dict[str, int | None]  # GPU0 -> 0, None for N/A

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]


def parse_topology(lines: list[str]) -> Topology | None:
    lines, status = split_status(lines, "nvidia-smi topo -m")
    if status != 0:
        return None
    lines = [strip_ansi(line) for line in lines]
    if not lines or not lines[0].startswith("\t"):
        raise UnparsedOutput("nvidia-smi topo -m", lines[0] if lines else "", "no header")
    header = lines[0].rstrip("\t").split("\t")[1:]
    devices = [h for h in header if re.fullmatch(r"(GPU|NIC)\d+", h)]
    named = header[len(devices) :]  # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID" (by driver age)
    links: dict[tuple[str, str], str] = {}
    cpu: dict[str, str] = {}
    numa: dict[str, int | None] = {}
    for line in lines[1:]:
        if not line.strip():
            break  # the Legend follows the first blank line
        name, *cells = line.split("\t")
        if name not in devices:
            raise UnparsedOutput("nvidia-smi topo -m", line, "unknown row")
        trailing = cells[len(devices) :]
        # "NUMA Affinity" is followed by two tabs before "GPU NUMA ID" in rows, one in the header
        if "GPU NUMA ID" in named and len(trailing) == len(named) + 1:
            gap = named.index("GPU NUMA ID")
            if trailing[gap] == "":
                del trailing[gap]
        if name.startswith("NIC"):
            trailing = []  # NIC rows carry no affinity (the cells are empty or absent)
        elif len(trailing) != len(named):
            raise UnparsedOutput("nvidia-smi topo -m", line, "wrong number of cells")
        for other, cell in zip(devices, cells, strict=False):
            if not _LINK.match(cell.strip()):
                raise UnparsedOutput("nvidia-smi topo -m", line, f"unknown link {cell!r}")
            links[(name, other)] = cell.strip()
        extra = dict(zip(named, trailing, strict=False))
        if "CPU Affinity" in extra:
            cpu[name] = extra["CPU Affinity"]
        if "NUMA Affinity" in extra:
            value = extra["NUMA Affinity"]
            numa[name] = int(value) if value.isdigit() else None
    return Topology(devices=devices, links=links, cpu_affinity=cpu, numa_affinity=numa)


class NvidiaTopology(Probe["Topology | None"]):
    """
    Returns the ``nvidia-smi topo -m`` link matrix (X, SYS, NODE, PHB, PXB, PIX, NV#) with CPU
    and NUMA affinity per GPU, parsed by header name; None when nvidia-smi cannot answer.
    """

    requires_command = "nvidia-smi"

    def command(self) -> str:
        return with_status("nvidia-smi topo -m")

    def process(self, output: list[str]) -> Topology | None:
        return parse_topology(output)


# --- nvidia-smi topo -p2p -------------------------------------------------------------------------

P2P_MODES = {"r": "read", "w": "write", "n": "nvlink", "a": "atomics", "p": "prop"}
_P2P_STATUS = {"X", "OK", "CNS", "GNS", "TNS", "NS", "U"}


def parse_p2p(lines: list[str]) -> dict[tuple[str, str], str] | None:
    lines, status = split_status(lines, "nvidia-smi topo -p2p")
    if status != 0:
        return None
    lines = [strip_ansi(line) for line in lines]
    if not lines:
        raise UnparsedOutput("nvidia-smi topo -p2p", "", "no output")
    gpus = lines[0].strip().split("\t")
    if not all(re.fullmatch(r"GPU\d+", g) for g in gpus):
        raise UnparsedOutput("nvidia-smi topo -p2p", lines[0], "unexpected header")
    matrix: dict[tuple[str, str], str] = {}
    for line in lines[1:]:
        if not line.strip():
            break  # Legend
        name, *cells = line.strip().split("\t")
        if name not in gpus or len(cells) != len(gpus) or not set(cells) <= _P2P_STATUS:
            raise UnparsedOutput("nvidia-smi topo -p2p", line)
        for other, cell in zip(gpus, cells, strict=True):
            matrix[(name, other)] = cell
    return matrix


class NvidiaP2P(Probe["dict[tuple[str, str], str] | None"]):
    """
    Returns the P2P capability matrix for one mode (r=read, w=write, n=nvlink, a=atomics,
    p=prop): (GPU0, GPU1) -> OK | CNS | GNS | TNS | NS | U.
    """

    requires_command = "nvidia-smi"

    def command(self, mode: str = "r") -> str:
        if mode not in P2P_MODES:
            raise ValueError(f"P2P mode must be one of {', '.join(P2P_MODES)}, not {mode!r}")
        return with_status(f"nvidia-smi topo -p2p {mode}")

    def process(self, output: list[str]) -> dict[tuple[str, str], str] | None:
        return parse_p2p(output)


# --- /proc/driver/nvidia ------------------------------------------------------------------------

_NVRM = re.compile(
    r"^NVRM version: NVIDIA UNIX (?P<kind>Open Kernel Module for \S+|\S+ Kernel Module)\s+"
    r"(?P<version>\d+\.\d+(?:\.\d+)?)\s"
)
_DRIVER_GCC = re.compile(
    r"^GCC version:\s+(?P<compiler>gcc version (?P<version>\d+\.\d+\.\d+).*?)\s*$"
)


@dataclass(frozen=True)
class DriverVersion:
    version: str  # 580.159.04
    open: bool  # open kernel modules (required for Blackwell)
    compiler: str  # "gcc version 12.2.0 (Debian 12.2.0-14)"
    gcc_version: str  # 12.2.0


def parse_driver_version(lines: list[str]) -> DriverVersion | None:
    lines = [line for line in lines if line.strip()]
    if not lines:
        return None  # the nvidia module is not loaded
    head = _NVRM.match(lines[0])
    gcc = _DRIVER_GCC.match(lines[1]) if len(lines) > 1 else None
    if not head:
        raise UnparsedOutput("/proc/driver/nvidia/version", lines[0])
    if not gcc:
        raise UnparsedOutput("/proc/driver/nvidia/version", lines[1] if len(lines) > 1 else "")
    return DriverVersion(
        version=head["version"],
        open=head["kind"].startswith("Open"),
        compiler=gcc["compiler"],
        gcc_version=gcc["version"],
    )


class NvidiaDriver(Probe["DriverVersion | None"]):
    """
    Returns the loaded NVIDIA kernel module's version, flavour (open or proprietary) and the
    compiler that built it, from ``/proc/driver/nvidia/version``; None when not loaded.
    """

    def command(self) -> str:
        return "cat /proc/driver/nvidia/version 2>/dev/null || true"

    def process(self, output: list[str]) -> DriverVersion | None:
        return parse_driver_version(output)


_INFO_HEADER = re.compile(r"^==> /proc/driver/nvidia/gpus/(?P<bdf>[0-9a-f:.]+)/information <==$")


def parse_gpu_information(lines: list[str]) -> dict[str, dict[str, str]]:
    """Per-BDF key/values of /proc/driver/nvidia/gpus/<bdf>/information (Model, GPU Firmware...)."""
    gpus: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in lines:
        if not line.strip():
            continue
        header = _INFO_HEADER.match(line)
        if header:
            current = gpus.setdefault(header["bdf"], {})
            continue
        key, sep, value = line.partition(":")
        if current is None or not sep:
            raise UnparsedOutput("/proc/driver/nvidia/gpus/*/information", line)
        current[key.strip()] = value.strip()
    return gpus


class NvidiaGpuInformation(Probe[dict[str, dict[str, str]]]):
    """
    Returns, per GPU BDF, the driver's information file: Model, GPU UUID, Video BIOS,
    Device Minor and "GPU Firmware" (the GSP firmware version, which must equal the driver's).
    """

    default = dict

    def command(self) -> str:
        return (
            "for f in /proc/driver/nvidia/gpus/*/information; do "
            '[ -f "$f" ] || continue; echo "==> $f <=="; cat "$f"; done'
        )

    def process(self, output: list[str]) -> dict[str, dict[str, str]]:
        return parse_gpu_information(output)


# --- what the next boot and the guests need: firmware, userspace, fabric manager ---------------

_FIRMWARE = re.compile(r"^/lib/firmware/nvidia/(?P<version>[^/]+)/(?P<file>gsp[^/]*\.bin)$")


def parse_firmware_files(lines: list[str]) -> dict[str, list[str]]:
    """Driver version -> GSP firmware files under /lib/firmware/nvidia/<version>/."""
    found: dict[str, list[str]] = {}
    for line in lines:
        m = _FIRMWARE.match(line.strip())
        if not m:
            raise UnparsedOutput("/lib/firmware/nvidia/*/gsp*.bin", line)
        found.setdefault(m["version"], []).append(m["file"])
    return found


class GspFirmwareFiles(Probe[dict[str, list[str]]]):
    """
    Returns the GSP firmware files on disk per driver version, e.g.
    ``{"595.71.05": ["gsp_ga10x.bin", "gsp_tu10x.bin"]}``: what the open module loads at boot.
    """

    default = dict

    def command(self) -> str:
        return "ls -1d /lib/firmware/nvidia/*/gsp*.bin 2>/dev/null; true"

    def process(self, output: list[str]) -> dict[str, list[str]]:
        return parse_firmware_files(output)


_LIB = re.compile(r"^(?P<path>/\S*/(?P<name>libcuda|libnvidia-ml)\.so\.(?P<version>[0-9.]+))$")


def parse_userspace(lines: list[str]) -> dict[str, list[str]]:
    """Library (libcuda, libnvidia-ml) -> the versions of the files the loader resolves."""
    found: dict[str, list[str]] = {}
    for line in lines:
        m = _LIB.match(line.strip())
        if not m:
            raise UnparsedOutput("NVIDIA userspace libraries", line)
        versions = found.setdefault(m["name"], [])
        if m["version"] not in versions:
            versions.append(m["version"])
    return found


class NvidiaUserspace(Probe[dict[str, list[str]]]):
    """
    Returns the NVIDIA userspace the dynamic loader resolves: ``{"libcuda": ["595.71.05"],
    "libnvidia-ml": ["595.71.05"]}`` (more than one version: two installs side by side). It must
    equal the kernel driver's version, or NVML and CUDA refuse to start.
    """

    default = dict

    def command(self) -> str:
        return (
            "ldconfig -p 2>/dev/null | sed -n 's/^.*\\(libcuda\\|libnvidia-ml\\)\\.so\\.1 .*=> //p' "
            '| while read -r lib; do readlink -f "$lib"; done | sort -u'
        )

    def process(self, output: list[str]) -> dict[str, list[str]]:
        return parse_userspace(output)


@dataclass(frozen=True)
class FabricManager:
    version: str | None  # the installed nvidia-fabricmanager package version
    active: str | None  # `systemctl is-active` answer
    enabled: str | None = None  # `systemctl is-enabled` answer


def parse_fabricmanager(lines: list[str]) -> FabricManager:
    version = active = enabled = None
    for line in lines:
        key, _, value = line.partition("=")
        if key == "package":
            version = value.split("-")[0] or None  # 595.71.05-1 -> 595.71.05
        elif key == "active":
            active = value or None
        elif key == "enabled":
            enabled = value or None
        else:
            raise UnparsedOutput("nvidia-fabricmanager state", line)
    return FabricManager(version, active, enabled)


# The daemon's package as NVIDIA names it: nvidia-fabricmanager-<branch> up to R575, plain
# nvidia-fabricmanager from R580 (not -dev, whose version would be read otherwise). Only an
# installed one counts ("ii"): a removed package's record ("rc") still carries a version.
FABRICMANAGER_QUERY = (
    "dpkg-query -W -f '${db:Status-Abbrev}|${Package}|${Version}\\n' 'nvidia-fabricmanager*' "
    "2>/dev/null | awk -F'|' '$1 ~ /^ii/ && $2 ~ /^nvidia-fabricmanager(-[0-9]+)?$/ "
    "{ print $3; exit }' | head -c 64"
)


class NvidiaFabricManager(Probe[FabricManager]):
    """Returns the installed nvidia-fabricmanager version (FABRICMANAGER_QUERY: an installed
    nvidia-fabricmanager[-N], not -dev, not a removed package's record) and whether its
    service is active."""

    def command(self) -> str:
        return (
            f'v=$({FABRICMANAGER_QUERY}); echo "package=$v"; '
            'echo "active=$(systemctl is-active nvidia-fabricmanager.service 2>/dev/null)"'
        )

    def process(self, output: list[str]) -> FabricManager:
        return parse_fabricmanager(output)
