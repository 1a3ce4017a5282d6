"""proxmox-boot-tool's read-only commands, `status` and `kernel list`, as proxmox-kernel-helper's
proxmox-boot-tool prints them (docs/reference/formats.md §2). Kept apart from bootloader.py: a
deploy's read runs both on every run, and they need none of the ESP, GRUB and initramfs code."""

from __future__ import annotations

import re
from pathlib import Path

from .boot_functions import (
    ESP_LIST,
    MANUAL_KERNEL_LIST,
    NEXT_BOOT_PIN,
    PINNED_KERNEL_CONF,
    TOOL,
    Exit,
    Out,
    _load_esps,
    boot_kernel_list,
    booted_uefi,
    esp_uuids,
    first_line,
)


def list_kernels(root: Path, out: Out) -> None:
    boot_kernels = boot_kernel_list(root)
    manual: list[str] = []
    manual_file = root / MANUAL_KERNEL_LIST
    if manual_file.exists():
        manual = [k for k in manual_file.read_text().split("\n") if k]
        boot_kernels = [k for k in boot_kernels if k not in manual]
    out.out("Manually selected kernels:")
    out.out("\n".join(manual) if manual else "None.")
    out.out("")
    out.out("Automatically selected kernels:")
    out.out("\n".join(boot_kernels))
    pinned, nextboot = first_line(root, PINNED_KERNEL_CONF), first_line(root, NEXT_BOOT_PIN)
    if pinned:
        out.out("")
        out.out("Pinned kernel:")
        out.out(pinned)
    if nextboot:
        out.out("")
        out.out("Kernel pinned on next-boot:")
        out.out(nextboot)


def status(root: Path, out: Out, quiet: bool) -> None:
    if not quiet:
        out.out(f"Re-executing '{TOOL}' in new private mount namespace..")
    uuids = esp_uuids(root)
    if uuids is None:
        if not quiet:
            out.err(f"E: /{ESP_LIST} does not exist.")
        raise Exit(2)
    if quiet:
        return
    out.out(f"System currently booted with {'uefi' if booted_uefi(root) else 'legacy bios'}")
    esps = _load_esps(root)
    for uuid in uuids:
        if not re.search(r"[0-9a-fA-F]{4}-[0-9a-fA-F]{4}", uuid):
            out.err(f"WARN: {uuid} read from /{ESP_LIST} does not look like a VFAT-UUID - skipping")
            continue
        esp = esps.get(uuid, {"mode": "uefi", "versions": []})
        versions = ", ".join(esp["versions"])  # type: ignore[arg-type]
        out.out(f"{uuid} is configured with: {esp['mode']} (versions: {versions})")
