"""zpool (status -x, list -H -o ...) and pvesm status over the twin's disks (hwsim/storage.py).

Formats: `zpool status -x` prints "all pools are healthy", "no pools available", or the status
block of each unhealthy pool (openzfs cmd/zpool/zpool_main.c); without the zfs module libzfs
cannot start ("The ZFS modules are not loaded.", lib/libzfs/libzfs_util.c libzfs_error_init).
`pvesm status` is pve-storage's $print_status (src/PVE/CLI/pvesm.pm, stable-8 L228-253): a
header, then one row per storage sorted by name, Status active|inactive|disabled; a storage
whose activation or status fails is warned about on stderr and shown inactive
(src/PVE/Storage.pm storage_info)."""

from __future__ import annotations

import re
from pathlib import Path

from .common import err, hwsim, load_hw, out

NOT_LOADED = "The ZFS modules are not loaded.\nTry running 'modprobe zfs' as root to load them.\n"
GONE = ("FAULTED", "UNAVAIL", "SUSPENDED")  # a pool in these states serves no storage


def _pools(hw) -> list[dict] | None:
    """The imported pools; None when the zfs module is not loaded."""
    if not hw.state.get("zfs_loaded"):
        return None
    return hwsim.storage.pools(hw.profile)


def _status_block(pool: dict) -> str:
    name, state = pool["name"], pool["state"]
    return (
        f"  pool: {name}\n state: {state}\n"
        "status: One or more devices could not be used because the label is missing or\n"
        "\tinvalid.  Sufficient replicas exist for the pool to continue\n"
        "\tfunctioning in a degraded state.\n"
        "action: Replace the device using 'zpool replace'.\n"
        "   see: https://openzfs.github.io/openzfs-docs/msg/ZFS-8000-4J\n"
        f"config:\n\n\tNAME        STATE     READ WRITE CKSUM\n\t{name:<11} {state:<8}     0     0     0\n"
        "\nerrors: No known data errors\n"
    )


def zpool(argv: list[str]) -> int:
    hw = load_hw()
    if hw is None:
        err("zpool: gpuhost twin: no machine state")
        return 1
    pools = _pools(hw)
    if pools is None:
        err(NOT_LOADED)
        return 1
    if argv[:2] == ["status", "-x"]:
        bad = [p for p in pools if p["state"] != "ONLINE"]
        if not pools:
            out("no pools available\n")
        elif not bad:
            out("all pools are healthy\n")
        else:
            out("\n".join(_status_block(p) for p in bad))
        return 0
    if argv[:1] == ["list"] and "-H" in argv and "-o" in argv[:-1]:
        columns = argv[argv.index("-o") + 1].split(",")
        values = {"name": lambda p: p["name"], "health": lambda p: p["state"]}
        if any(c not in values for c in columns):
            err(f"invalid property '{columns[0]}'")
            return 2
        for p in pools:
            out("\t".join(values[c](p) for c in columns) + "\n")
        return 0
    err(f"gpuhost twin: zpool {' '.join(argv)} is not simulated")
    return 2


def _storages(root: Path) -> list[dict]:
    """/etc/pve/storage.cfg sections: `type: id`, then tab-indented `key value` lines."""
    path = root / "etc/pve/storage.cfg"
    found: list[dict] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        head = re.fullmatch(r"([a-z][a-z0-9]*):\s*(\S+)\s*", line)
        if head:
            found.append({"type": head[1], "id": head[2]})
        elif line.strip() and found:
            key, _, value = line.strip().partition(" ")
            found[-1][key] = value.strip()
    return found


def _set_content(root: Path, storeid: str, content: str) -> int:
    """`pvesm set <storage> --content <list>` (pve-storage API2/Storage/Config.pm update:
    the section's `content` line replaced, other lines as they were; the twin checks no
    content type against the storage type)."""
    path = root / "etc/pve/storage.cfg"
    lines = path.read_text().splitlines() if path.exists() else []
    start = next((i for i, ln in enumerate(lines)
                  if re.fullmatch(rf"[a-z][a-z0-9]*:\s*{re.escape(storeid)}\s*", ln)), None)  # fmt: skip
    if start is None:
        err(f"update storage failed: storage '{storeid}' does not exist\n")
        return 255
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    body = [ln for ln in lines[start + 1 : end] if ln.strip().partition(" ")[0] != "content"]
    lines[start + 1 : end] = [*body, f"\tcontent {content}"]
    path.write_text("\n".join(lines) + "\n")
    return 0


def pvesm(argv: list[str]) -> int:
    hw = load_hw()
    if hw is not None and argv[:1] == ["set"] and len(argv) == 4 and argv[2] == "--content":
        return _set_content(hw.root, argv[1], argv[3])
    if hw is None or argv[:1] != ["status"]:
        err("gpuhost twin: only `pvesm status` and `pvesm set <id> --content` are simulated")
        return 2
    pools = _pools(hw)
    imported = {p["name"] for p in pools or [] if p["state"] not in GONE}
    rows = []
    for s in sorted(_storages(hw.root), key=lambda s: s["id"]):
        status = "active"
        if s["type"] == "zfspool" and s.get("pool", "").split("/")[0] not in imported:
            err(f"zfs error: cannot open '{s.get('pool', '').split('/')[0]}': no such pool")
            status = "inactive"
        if "disable" in s:
            status = "disabled"
        rows.append((s["id"], s["type"], status))
    width = max([len(r[0]) for r in rows] + [0]) + 1
    out(
        f"{'Name':<{width}} {'Type':>10} {'Status':>10} {'Total (KiB)':>15} {'Used (KiB)':>15}"
        f" {'Available (KiB)':>15} {'%':>8}\n"
    )
    for name, kind, status in rows:
        total, used = (0, 0) if status != "active" else (959_685_632, 10_485_760)
        per = (
            f"{'N/A':>8}" if status == "disabled" else f"{used * 100 / total if total else 0:7.2f}%"
        )
        out(
            f"{name:<{width}} {kind:>10} {status:>10} {total:>15d} {used:>15d}"
            f" {total - used:>15d} {per}\n"
        )
    return 0
