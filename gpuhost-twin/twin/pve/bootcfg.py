"""The bootloader's view of the world as the twin's boot reads it: <root>/var/lib/gpuhost-twin/
bootcfg.json, written by refresh (ESP hosts) and update-grub (GRUB hosts) in twin/kernel_choice.py's format
(see bootloader.py's docstring for the fields and the --next-boot rule)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .boot_functions import (
    BOOTCFG,
    NEXT_BOOT_PIN,
    PINNED_KERNEL_CONF,
    _write_json,
    booted_uefi,
    first_line,
    version_key,
)
from .config import TWIN_STATE


def write_bootcfg(
    root: Path,
    loader: str,
    kernels: list[str],
    entries: dict[str, str],
    initrd: dict[str, object] | None,
    written_by: str,
    grub_default: str | None = None,
) -> None:
    """Record what the bootloader now holds (twin/kernel_choice.py's bootcfg.json format)."""
    kernels = sorted(kernels, key=version_key)  # oldest first: the boot takes [-1] as newest
    pin = first_line(root, PINNED_KERNEL_CONF) or None
    next_pin = first_line(root, NEXT_BOOT_PIN) or None
    newest = kernels[-1] if kernels else None

    def bootable(version: str | None) -> str | None:
        return version if version in kernels else None

    if loader == "systemd-boot":  # loader.conf: next-boot pin, else pin, else "proxmox-*"
        loader_default = bootable(next_pin or pin) or newest
    else:
        loader_default = bootable(grub_default) or newest
    if _strict_next_boot(root) or not bootable(next_pin):
        default, next_kernel = loader_default, None
    else:  # kernel_choice.py's model: a firmware one-shot entry over the permanent default
        # (GRUB: the default without the pin snippet is approximated by pin, else newest)
        default, next_kernel = bootable(pin) or newest, next_pin
    _write_json(
        root / BOOTCFG,
        {
            "loader": loader,
            "firmware": "uefi" if booted_uefi(root) else "bios",
            "cmdline": entries.get(default or "", ""),
            "kernel_default": default,
            "kernel_next": next_kernel,
            "kernels": kernels,
            "loader_default": loader_default,
            "kernel_pin": pin,
            "entries": entries,
            "initrd": initrd,
            "written_by": written_by,
            "written_at": time.time(),
        },
    )


def _strict_next_boot(root: Path) -> bool:
    try:
        return bool(
            json.loads((root / TWIN_STATE / "pve.json").read_text()).get("strict_next_boot")
        )
    except (FileNotFoundError, ValueError):
        return False
