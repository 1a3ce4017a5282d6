"""update-initramfs (initramfs-tools): the twin's initrd records the module configuration at
generation time; each generation runs proxmox-boot-sync (stdlib only)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from .boot_functions import (
    Exit,
    Out,
    installed_kernels,
)
from .esp_sync import refresh

# --- update-initramfs ---

INITRAMFS_SOURCES = ("etc/modprobe.d", "etc/modules-load.d", "etc/modules", "etc/initramfs-tools")


def initramfs_record(root: Path, version: str) -> dict[str, object]:
    """What the twin's initrd 'contains': the module configuration at generation time."""
    files: dict[str, str] = {}
    for rel in INITRAMFS_SOURCES:
        base = root / rel
        paths = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else [base]
        for path in paths:
            if path.is_file():
                files["/" + str(path.relative_to(root))] = path.read_text(errors="replace")
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {
        "generator": "gpuhost-twin update-initramfs",
        "kernel": version,
        "generated_at": time.time(),
        "sha256": digest,
        "files": files,
    }


def update_initramfs(
    root: Path, out: Out, mode: str, version: str | None, from_kernel_hook: bool = False
) -> None:
    """update-initramfs -u|-c [-k <ver>|all]; each generation runs proxmox-boot-sync."""
    kernels = installed_kernels(root)
    with_initrd = [k for k in kernels if (root / f"boot/initrd.img-{k}").exists()]
    if version == "all":
        targets = with_initrd if mode == "update" else kernels
    elif version:
        targets = [version]
    else:
        targets = with_initrd[:1]  # the highest version with an initramfs
        if not targets:
            return  # "Nothing to do, exiting."
    for ver in targets:
        initrd = root / f"boot/initrd.img-{ver}"
        if mode == "update" and not initrd.exists():
            out.err(f"/boot/initrd.img-{ver} does not exist. Cannot update.")
            return  # initramfs-tools' mild_panic: message and exit 0
        if not (root / f"boot/vmlinuz-{ver}").exists() and mode == "create":
            out.err(f"update-initramfs: /boot/vmlinuz-{ver} does not exist. Cannot create.")
            raise Exit(1)
        out.out(f"update-initramfs: Generating /boot/initrd.img-{ver}")
        initrd.parent.mkdir(parents=True, exist_ok=True)
        initrd.write_text(json.dumps(initramfs_record(root, ver), indent=1) + "\n")
        if not (from_kernel_hook or os.environ.get("INITRAMFS_TOOLS_KERNEL_HOOK")):
            refresh(
                root, out, hook="zz-proxmox-boot"
            )  # /etc/initramfs/post-update.d/proxmox-boot-sync
