"""Health of ZFS pools and Proxmox storages, for the audit and the trial gate.

`zpool status -x` (openzfs cmd/zpool/zpool_main.c) prints "all pools are healthy", "no pools
available", or a status block per pool that is not healthy (`  pool: NAME`, ` state: STATE`,
...); when libzfs cannot reach the module it fails with "The ZFS modules are not loaded."
(lib/libzfs/libzfs_util.c). `pvesm status` (pve-storage src/PVE/CLI/pvesm.pm $print_status,
stable-8) prints a header `Name Type Status Total (KiB) Used (KiB) Available (KiB) %` and one
row per storage with Status active, inactive or disabled; a storage whose activation or status
fails is warned about on stderr and listed inactive (src/PVE/Storage.pm storage_info).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe

_POOL = re.compile(r"^\s*pool: (?P<name>\S+)$")
_STATE = re.compile(r"^\s*state: (?P<state>\S+)$")
_ROW = re.compile(r"^(?P<id>\S+)\s+(?P<type>\S+)\s+(?P<status>active|inactive|disabled)\s")


@dataclass(frozen=True)
class ZpoolStatus:
    unhealthy: dict[str, str] = field(default_factory=dict)  # pool -> state
    error: str | None = None  # zpool failed (exit status, then its message)


@dataclass(frozen=True)
class PvesmStatus:
    storages: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (type, status)
    warnings: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class StorageHealth:
    """None where the tool is not installed."""

    zpool: ZpoolStatus | None = None
    pvesm: PvesmStatus | None = None


def parse_zpool_status(lines: list[str], rc: int) -> ZpoolStatus:
    text = [line for line in lines if line.strip()]
    if rc != 0:
        return ZpoolStatus(error=f"exit status {rc}: " + " ".join(t.strip() for t in text))
    if text in (["all pools are healthy"], ["no pools available"]):
        return ZpoolStatus()
    unhealthy, name = {}, None
    for line in text:
        pool, state = _POOL.match(line), _STATE.match(line)
        if pool:
            name = pool["name"]
        elif state and name:
            unhealthy[name] = state["state"]
    if not unhealthy:
        raise UnparsedOutput("zpool status -x", text[0] if text else "", "no pool and no verdict")
    return ZpoolStatus(unhealthy=unhealthy)


def parse_pvesm_status(lines: list[str], rc: int, warnings: list[str]) -> PvesmStatus:
    if rc != 0:
        return PvesmStatus(error=f"exit status {rc}: " + " ".join(warnings or lines)[:300])
    rows = [line for line in lines if line.strip()]
    if rows and rows[0].split()[:3] == ["Name", "Type", "Status"]:
        rows = rows[1:]
    storages = {}
    for line in rows:
        m = _ROW.match(line)
        if not m:
            raise UnparsedOutput("pvesm status", line)
        storages[m["id"]] = (m["type"], m["status"])
    return PvesmStatus(storages=storages, warnings=tuple(warnings))


def parse_storage_health(lines: list[str]) -> StorageHealth:
    sections: dict[str, list[str]] = {}
    codes: dict[str, int] = {}
    current = None
    for line in lines:
        if line.startswith("== ") and line[3:].split()[:1] in (
            ["zpool"],
            ["pvesm"],
            ["warning"],
            ["rc"],
        ):
            word, _, rest = line[3:].partition(" ")
            if word == "rc" and current:
                codes[current] = int(rest)
            elif word in ("zpool", "pvesm"):
                current = word
                sections[word] = []
            else:
                sections.setdefault("warning", []).append(rest)
            continue
        if current is None:
            raise UnparsedOutput("storage health", line, "line before any section")
        sections[current].append(line)
    zpool = pvesm = None
    if "zpool" in sections:
        zpool = parse_zpool_status(sections["zpool"], codes.get("zpool", 0))
    if "pvesm" in sections:
        pvesm = parse_pvesm_status(
            sections["pvesm"], codes.get("pvesm", 0), sections.get("warning", [])
        )
    return StorageHealth(zpool=zpool, pvesm=pvesm)


class StorageHealthFact(Probe[StorageHealth]):
    """
    Returns ``StorageHealth(zpool=ZpoolStatus(unhealthy={"tank": "DEGRADED"}),
    pvesm=PvesmStatus(storages={"local": ("dir", "active")}))``; a part is None where its tool
    (zpool, pvesm) is not installed.
    """

    default = StorageHealth

    def command(self) -> str:
        return (
            "if command -v zpool >/dev/null 2>&1; then echo '== zpool'; "
            'zpool status -x 2>&1; echo "== rc $?"; fi; '
            "if command -v pvesm >/dev/null 2>&1; then "
            "e=$(mktemp \"${TMPDIR:-/tmp}/gpuhost-pvesm.XXXXXX\"); echo '== pvesm'; "
            'pvesm status 2>"$e"; echo "== rc $?"; sed \'s/^/== warning /\' "$e"; rm -f "$e"; '
            "fi; true"
        )

    def process(self, output: list[str]) -> StorageHealth:
        return parse_storage_health(output)
