"""Which Debian and which Proxmox VE release the host runs: /etc/os-release and pve-manager.

Proxmox VE 8 is built on Debian 12 (bookworm), 9 on Debian 13 (trixie); the release is read
from the pve-manager package (what `pveversion` prints first), the Debian release from
os-release, never inferred from kernel names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe

_OS_KEYS = ("ID", "VERSION_ID", "VERSION_CODENAME")
_VERSION = re.compile(r"[0-9][A-Za-z0-9.+~:-]*")


@dataclass(frozen=True)
class HostRelease:
    distribution: str | None = None  # os-release ID: "debian"
    debian: str | None = None  # VERSION_ID: "13"
    codename: str | None = None  # VERSION_CODENAME: "trixie"
    pve_manager: str | None = None  # installed pve-manager version: "9.0.10"; None: not installed
    qemu_server: str | None = None  # installed qemu-server version (VM passthrough); None: not

    @property
    def pve_major(self) -> int | None:
        return int(self.pve_manager.split(".")[0]) if self.pve_manager else None

    def describe(self) -> str:
        pve = f"Proxmox VE {self.pve_manager}" if self.pve_manager else "no Proxmox VE"
        debian = f"Debian {self.debian or '?'} ({self.codename or '?'})"
        return f"{pve} on {debian}"


PACKAGES = ("pve-manager", "qemu-server")  # read with dpkg-query, one line each when known


def parse_release(lines: list[str]) -> HostRelease:
    """``os ID=debian``, ``os VERSION_ID="13"``..., ``pve-manager ii 9.0.10`` and
    ``qemu-server ii 9.0.22`` lines (dpkg's status abbreviation, then the version)."""
    found: dict[str, str] = {}
    versions: dict[str, str | None] = {}
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "os":
            key, eq, value = rest.partition("=")
            value = value.strip().strip("\"'")
            if key not in _OS_KEYS or not eq or not re.fullmatch(r"[A-Za-z0-9._-]*", value):
                raise UnparsedOutput("os-release", line)
            found[key] = value
        elif kind in PACKAGES:
            words = rest.split()  # known to dpkg but not installed ("un"): no version
            if len(words) == 1 and words[0] != "ii":
                versions[kind] = None
                continue
            if len(words) != 2 or not _VERSION.fullmatch(words[1]):
                raise UnparsedOutput(f"dpkg-query {kind}", line)
            versions[kind] = words[1] if words[0] == "ii" else None
        elif line.strip():
            raise UnparsedOutput("host release", line)
    return HostRelease(
        found.get("ID") or None,
        found.get("VERSION_ID") or None,
        found.get("VERSION_CODENAME") or None,
        versions.get("pve-manager"),
        versions.get("qemu-server"),
    )


class HostReleaseFact(Probe[HostRelease]):
    """
    Returns the host's :class:`HostRelease`: os-release's ID, VERSION_ID and VERSION_CODENAME
    and the installed pve-manager and qemu-server versions
    (``HostRelease("debian", "13", "trixie", "9.0.10", "9.0.22")``).
    """

    default = HostRelease

    def command(self) -> str:
        return (
            "grep -E '^(ID|VERSION_ID|VERSION_CODENAME)=' /etc/os-release 2>/dev/null "
            "| sed 's/^/os /'; "
            "dpkg-query -W -f '${Package} ${db:Status-Abbrev} ${Version}\\n' "
            f"{' '.join(PACKAGES)} 2>/dev/null; true"
        )

    def process(self, output: list[str]) -> HostRelease:
        return parse_release(output)
