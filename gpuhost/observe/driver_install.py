"""What the NVIDIA driver deploys compare against: the installed modules' hashes, what a build
on the host may use (cores, available memory), and the installed userspace and firmware."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from gpuhost.observe.nvidia_driver import (
    FABRICMANAGER_QUERY,
    FabricManager,
    GspFirmwareFiles,
    NvidiaUserspace,
    parse_fabricmanager,
    parse_firmware_files,
    parse_userspace,
)
from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe

# Written before modules are replaced, removed once depmod and the vermagic check passed: a run
# killed in between leaves it, and the next run installs again instead of trusting the hashes.
PENDING = ".gpuhost-pending"
_SHA_LINE = re.compile(r"^(?P<sha>[0-9a-f]{64})  (?P<path>/\S+)$")


def parse_module_hashes(lines: list[str]) -> dict[str, str]:
    """File name -> sha256 from ``sha256sum`` lines (no lines: no modules there)."""
    found = {}
    for line in lines:
        if not line.strip():
            continue
        if line.strip() == PENDING:
            found[PENDING] = ""
            continue
        match = _SHA_LINE.match(line)
        if not match:
            raise UnparsedOutput("installed module hashes", line)
        found[match["path"].rsplit("/", 1)[1]] = match["sha"]
    return found


class ModuleHashes(Probe[dict[str, str]]):
    """
    Returns the sha256 of every ``*.ko`` in ``directory``, by file name:
    ``{"nvidia.ko": "3f2a...", "nvidia-uvm.ko": "..."}``; empty when there is none; with a
    ``.gpuhost-pending`` key when an install did not finish. One command for all of them, so a
    converged run compares locally.
    """

    default = dict

    def command(self, directory: str) -> str:
        quoted = shlex.quote(directory.rstrip("/"))
        return (
            f'for f in {quoted}/*.ko; do [ -f "$f" ] && sha256sum "$f"; done; '
            f"[ -e {quoted}/{PENDING} ] && echo {PENDING}; true"
        )

    def process(self, output: list[str]) -> dict[str, str]:
        return parse_module_hashes(output)


def parse_build_resources(lines: list[str]) -> tuple[int, int]:
    """(cores, MemAvailable in bytes) from ``nproc`` and /proc/meminfo's MemAvailable line."""
    text = [line.strip() for line in lines if line.strip()]
    if len(text) != 2 or not text[0].isdigit():
        raise UnparsedOutput("build resources", " | ".join(text), "want nproc, MemAvailable")
    match = re.fullmatch(r"MemAvailable:\s+(\d+) kB", text[1])
    if not match:
        raise UnparsedOutput("build resources", text[1], "not a MemAvailable line")
    return int(text[0]), int(match[1]) * 1024


class BuildResources(Probe[tuple[int, int]]):
    """Returns ``(cores, MemAvailable bytes)``, e.g. ``(16, 134582738944)``: build jobs derive
    from both (gpuhost.plan.driver.toolchain.build_jobs), never from cores alone."""

    def command(self) -> str:
        return "nproc; grep '^MemAvailable:' /proc/meminfo"

    def process(self, output: list[str]) -> tuple[int, int]:
        return parse_build_resources(output)


# --- the driver's userspace, firmware, persistence daemon and fabric manager --------------------

PERSISTENCED = "/usr/bin/nvidia-persistenced"
PERSISTENCED_USER = "nvidia-persistenced"  # the user NVIDIA's sample unit runs the daemon as


@dataclass(frozen=True)
class UserspaceState:
    """What the host shows of the driver outside its kernel modules."""

    libraries: dict[str, list[str]]  # libcuda / libnvidia-ml -> versions the loader resolves
    firmware: dict[str, list[str]]  # driver version -> gsp_*.bin under /lib/firmware/nvidia/
    persistenced: bool  # /usr/bin/nvidia-persistenced is there
    persistenced_user: bool  # the daemon's user exists
    fabric: FabricManager

    def installed(self, version: str) -> bool:
        """The userspace and GSP firmware of exactly ``version``, and nothing of another."""
        return (
            self.libraries == {"libcuda": [version], "libnvidia-ml": [version]}
            and bool(self.firmware.get(version))
            and self.persistenced
        )


_SECTIONS = ("userspace", "firmware", "persistenced", "fabric")


def parse_userspace_state(lines: list[str]) -> UserspaceState:
    parts: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        if line.startswith("#section="):
            current = parts.setdefault(line.removeprefix("#section="), [])
        elif current is None:
            raise UnparsedOutput("NVIDIA userspace state", line, "before any section")
        elif line.strip():
            current.append(line)
    if sorted(parts) != sorted(_SECTIONS):
        raise UnparsedOutput("NVIDIA userspace state", " ".join(parts), "missing sections")
    flags = dict(line.partition("=")[::2] for line in parts["persistenced"])
    return UserspaceState(
        libraries=parse_userspace(parts["userspace"]),
        firmware=parse_firmware_files(parts["firmware"]),
        persistenced=flags.get("binary") == "yes",
        persistenced_user=flags.get("user") == "yes",
        fabric=parse_fabricmanager(parts["fabric"]),
    )


# The fabric manager as the deploy reads it: only an installed nvidia-fabricmanager[-<branch>]
# (not -dev, not a removed package's record), whether its unit is active and enabled.
FABRIC_STATE = (
    f'v=$({FABRICMANAGER_QUERY}); echo "package=$v"; '
    'echo "active=$(systemctl is-active nvidia-fabricmanager.service 2>/dev/null)"; '
    'echo "enabled=$(systemctl is-enabled nvidia-fabricmanager.service 2>/dev/null)"'
)


class DriverUserspace(Probe[UserspaceState]):
    """
    Returns the userspace libraries' versions (as the loader resolves them), the GSP firmware
    on disk, whether nvidia-persistenced and its user are there, and the fabric manager: the
    audit's own facts (NvidiaUserspace, GspFirmwareFiles) and the fabric manager's package and
    unit state (FABRIC_STATE) in one command.
    """

    def command(self) -> str:
        persistenced = (
            f"[ -x {PERSISTENCED} ] && echo binary=yes; "
            f"getent passwd {PERSISTENCED_USER} >/dev/null && echo user=yes; true"
        )
        parts = (
            ("userspace", NvidiaUserspace().command()),
            ("firmware", GspFirmwareFiles().command()),
            ("persistenced", persistenced),
            ("fabric", FABRIC_STATE),
        )
        return "; ".join(f"echo '#section={name}'; {{ {cmd}; }}" for name, cmd in parts)

    def process(self, output: list[str]) -> UserspaceState:
        return parse_userspace_state(output)
