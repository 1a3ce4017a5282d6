"""The loaded NVIDIA driver and what must match it: /proc/driver/nvidia (version, compiler,
per-GPU information), the GSP firmware files, the userspace libraries, the fabric manager."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuhost.observe.parse import (
    UnparsedOutput,
)
from gpuhost.observe.probe import Probe

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
