"""The GPUs as nvidia-smi shows them: the per-GPU query, the topology and the P2P matrices."""

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
