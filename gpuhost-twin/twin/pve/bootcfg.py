"""The boot loader's view of the world as the twin's boot reads it: <root>/var/lib/gpuhost-twin/
bootcfg.json, written by refresh (ESP hosts) and update-grub (GRUB hosts) in twin/kernel_choice.py's
format. "kernel_default" is what the loader really holds: a --next-boot pin is written exactly like
a permanent pin (it wins over it) until proxmox-boot-cleanup.service removes it."""

from __future__ import annotations

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


def write_bootcfg(
    root: Path,
    loader: str,
    kernels: list[str],
    entries: dict[str, str],
    initrd: dict[str, object] | None,
    written_by: str,
    grub_default: str | None = None,
    **extra: object,
) -> None:
    """Record what the boot loader now holds (twin/kernel_choice.py's bootcfg.json format)."""
    kernels = sorted(kernels, key=version_key)  # oldest first: the boot takes [-1] as newest
    pin = first_line(root, PINNED_KERNEL_CONF) or None
    next_pin = first_line(root, NEXT_BOOT_PIN) or None
    newest = kernels[-1] if kernels else None

    def bootable(version: str | None) -> str | None:
        return version if version in kernels else None

    if loader == "systemd-boot":  # loader.conf: next-boot pin, else pin, else "proxmox-*"
        default = bootable(next_pin or pin) or newest
    else:  # GRUB_DEFAULT as grub-mkconfig rendered it (the pin snippet included)
        default = bootable(grub_default) or newest
    _write_json(
        root / BOOTCFG,
        {
            "loader": loader,
            "firmware": "uefi" if booted_uefi(root) else "bios",
            "cmdline": entries.get(default or "", ""),
            "kernel_default": default,
            "kernels": kernels,
            "kernel_pin": pin,
            "next_boot_pin": next_pin,
            "entries": entries,
            "initrd": initrd,
            **extra,
            "written_by": written_by,
            "written_at": time.time(),
        },
    )
