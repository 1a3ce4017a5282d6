"""update-initramfs (initramfs-tools): the twin's initrd records the module configuration at
generation time; each generation runs proxmox-boot-sync (stdlib only).

What the record holds, as mkinitramfs would put it in the image: /etc/modprobe.d and
/etc/initramfs-tools (the kmod hook copies modprobe.d; nothing copies modules-load.d or
/etc/modules, which only the real root's systemd-modules-load reads); the udev rules Debian's
udev hook copies (a fixed list, plus /etc/udev/rules.d/*.rules without a /usr/lib twin); the
MODULES= policy (initramfs.conf, conf.d; "most" by default) and the modules that hooks add by
name (their manual_add_modules and force_load lines; the hooks are read, not run). Which
modules MODULES=most adds is decided at boot from the kernel's tree (boot_modules.py). Files
that other hooks would copy (scripts, binaries) are not recorded: an install command that
names one fails in the initramfs stage (boot_modules.py)."""

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

INITRAMFS_SOURCES = ("etc/modprobe.d", "etc/initramfs-tools")
HOOK_DIRS = ("usr/share/initramfs-tools/hooks", "etc/initramfs-tools/hooks")
CRYPTROOT_HOOK = "usr/share/initramfs-tools/hooks/cryptroot"  # cryptsetup-initramfs
# systemd's debian/extra/initramfs-tools/hooks/udev: the rules files it copies by name.
UDEV_RULES = (
    "50-firmware.rules",
    "50-udev-default.rules",
    "60-block.rules",
    "60-persistent-storage.rules",
    "61-persistent-storage-android.rules",
    "71-seat.rules",
    "73-special-net-names.rules",
    "75-net-description.rules",
    "80-net-setup-link.rules",
    "80-drivers.rules",
)


def _udev_rules(root: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    for name in UDEV_RULES:
        for d in ("etc/udev/rules.d", "usr/lib/udev/rules.d", "lib/udev/rules.d"):
            if (root / d / name).is_file():
                files[f"/usr/lib/udev/rules.d/{name}"] = (root / d / name).read_text(
                    errors="replace"
                )
                break
    custom = root / "etc/udev/rules.d"
    for path in sorted(custom.glob("*.rules")) if custom.is_dir() else []:
        if not (root / "usr/lib/udev/rules.d" / path.name).exists():
            files[f"/usr/lib/udev/rules.d/{path.name}"] = path.read_text(errors="replace")
    return files


def hook_modules(root: Path) -> list[str]:
    """Modules the executable hooks add by name (mkinitramfs runs only executable hooks)."""
    names: list[str] = []
    for d in HOOK_DIRS:
        for hook in sorted((root / d).iterdir()) if (root / d).is_dir() else []:
            if not (hook.is_file() and os.access(hook, os.X_OK)):
                continue
            for line in hook.read_text(errors="replace").splitlines():
                words = line.split("#", 1)[0].split()
                if words[:1] in (["manual_add_modules"], ["force_load"]):
                    names += words[1:2] if words[0] == "force_load" else words[1:]
    return names


def modules_policy(root: Path) -> str:
    """MODULES= of initramfs.conf and then conf.d/* (the last one wins); "most" by default."""
    policy = "most"
    conf = root / "etc/initramfs-tools"
    extra = sorted((conf / "conf.d").glob("*")) if (conf / "conf.d").is_dir() else []
    for path in [conf / "initramfs.conf", *extra]:
        for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
            if line.strip().startswith("MODULES="):
                policy = line.split("=", 1)[1].strip().strip("\"'")
    return policy


def initramfs_record(root: Path, version: str) -> dict[str, object]:
    """What the twin's initrd 'contains': the module configuration at generation time."""
    files: dict[str, str] = {}
    for rel in INITRAMFS_SOURCES:
        base = root / rel
        paths = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else [base]
        for path in paths:
            if path.is_file():
                files["/" + str(path.relative_to(root))] = path.read_text(errors="replace")
    files.update(_udev_rules(root))
    # cryptsetup-initramfs' hook copies the crypttab entries the initramfs unlocks (twin/boot_stop.py)
    if (root / CRYPTROOT_HOOK).is_file() and (root / "etc/crypttab").is_file():
        files["/etc/crypttab"] = (root / "etc/crypttab").read_text(errors="replace")
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {
        "generator": "gpuhost-twin update-initramfs",
        "kernel": version,
        "generated_at": time.time(),
        "sha256": digest,
        "files": files,
        "modules": hook_modules(root),
        "modules_policy": modules_policy(root),
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


# --- mkinitramfs ---

MKINITRAMFS_USAGE = "Usage: mkinitramfs [option]... -o outfile [version]"


def mkinitramfs(root: Path, out: Out, outfile: str, version: str) -> None:
    """`mkinitramfs -o OUTFILE VERSION` (initramfs-tools-core): one image written to OUTFILE and
    nothing else: no state under /var/lib/initramfs-tools and no post-update hooks (those are
    update-initramfs's), so proxmox-boot-sync does not run."""
    if not (root / f"lib/modules/{version}").is_dir():
        out.err(f"mkinitramfs: /lib/modules/{version} does not exist")
        raise Exit(1)
    target = root / outfile.lstrip("/")
    if not target.parent.is_dir():
        out.err(f"mkinitramfs: {target.parent.relative_to(root)} does not exist")
        raise Exit(1)
    target.write_text(json.dumps(initramfs_record(root, version), indent=1) + "\n")
