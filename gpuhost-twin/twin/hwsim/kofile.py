"""Kernel module files: module names, and what a real .ko says about itself (ELF sections,
modinfo fields, the GCC release that built it), read without readelf or modinfo."""

from __future__ import annotations

import re
import struct
from pathlib import Path


def norm(name: str) -> str:
    """Module names: '-' and '_' are one (vfio-pci == vfio_pci)."""
    return name.replace("-", "_")


def gcc_release(text: str) -> str | None:
    """'gcc (Debian 12.2.0-14) 12.2.0' or 'GCC: (GCC) 15.3.0' -> '12.2.0' / '15.3.0'."""
    found = re.findall(r"(\d+\.\d+\.\d+)\s*$", text.strip())
    return found[-1] if found else None


def read_elf_sections(path: Path, names: tuple[str, ...] = (".modinfo", ".comment")) -> dict:
    """Raw bytes of the named sections of a real ELF64 .ko (no readelf needed in the twin)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path}: not an ELF64 object")
    (e_shoff,) = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [
        struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)
    ]
    strtab = headers[e_shstrndx]
    out = {}
    for h in headers:
        start = strtab[4] + h[0]
        name = data[start : data.index(b"\0", start)].decode()
        if name in names:
            out[name] = data[h[4] : h[4] + h[5]]
    return out


def ko_info(path: Path) -> dict:
    """modinfo-like fields of a real .ko plus 'comment' (the .comment GCC line)."""
    sections = read_elf_sections(path)
    info: dict[str, str] = {}
    for item in sections.get(".modinfo", b"").split(b"\0"):
        if b"=" in item:
            key, _, value = item.decode(errors="replace").partition("=")
            info.setdefault(key, value)
    comments = [c.decode() for c in sections.get(".comment", b"").split(b"\0") if c.strip()]
    info["comment"] = comments[0] if comments else ""
    return info
