"""EFI variables as Linux's efivarfs shows them (stdlib only).

/sys/firmware/efi/efivars/<Name>-<vendor GUID>: 4 bytes of attributes (little-endian u32), then
the raw payload; the Boot Loader Interface strings are UTF-16LE with a trailing NUL. The directory
stands for the machine's NVRAM, so non-volatile variables survive reboots (the overlay keeps it);
the boot rewrites the volatile ones (LoaderInfo, LoaderEntrySelected).

Firmware that blocks writes from the OS (profile quirk efivars_readonly, e.g. a Dell setting):
a write returns as if it worked but nothing sticks, so only a read-back notices.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .machine import PROFILE

EFIVARS = "sys/firmware/efi/efivars"
LOADER_GUID = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"  # systemd's Boot Loader Interface vendor
NV_BS_RT = 0x07  # EFI_VARIABLE_NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS
BS_RT = 0x06  # volatile: gone at the next boot


def var_path(root: Path, name: str, guid: str = LOADER_GUID) -> Path:
    return Path(root) / EFIVARS / f"{name}-{guid}"


def uefi(root: Path) -> bool:
    return (Path(root) / "sys/firmware/efi").is_dir()


def read_string(root: Path, name: str) -> str | None:
    """The UTF-16LE string of a variable (without the trailing NUL), None if unset."""
    try:
        data = var_path(root, name).read_bytes()
    except FileNotFoundError:
        return None
    return data[4:].decode("utf-16-le", errors="replace").split("\0", 1)[0]


def write_string(root: Path, name: str, value: str, attrs: int = NV_BS_RT) -> None:
    """Set (or with "" delete) a loader string variable, as the OS would through efivarfs."""
    if readonly(root):
        return  # the firmware drops it; the caller sees success
    _store(root, name, value, attrs)


def firmware_set(root: Path, name: str, value: str | None, attrs: int = BS_RT) -> None:
    """What the boot loader itself sets or deletes (boot services: the quirk does not apply)."""
    _store(root, name, value or "", attrs)


def _store(root: Path, name: str, value: str, attrs: int) -> None:
    path = var_path(root, name)
    if not value:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(attrs.to_bytes(4, "little") + (value + "\0").encode("utf-16-le"))
    os.replace(tmp, path)


def readonly(root: Path) -> bool:
    try:
        profile = json.loads((Path(root) / PROFILE).read_text())
    except (FileNotFoundError, ValueError):
        return False
    return bool((profile.get("quirks") or {}).get("efivars_readonly"))
