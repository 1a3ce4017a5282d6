"""proxmox-boot-tool refresh: kernels, initrds and the loader configuration synced to every ESP
(proxmox-boot/zz-proxmox-boot and proxmox-boot-sync; stdlib only)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from .boot_functions import (
    ESP_LIST,
    ESP_STATE,
    KERNEL_CMDLINE,
    NEXT_BOOT_PIN,
    PINNED_KERNEL_CONF,
    Exit,
    Out,
    _load_esps,
    _write_json,
    boot_kernel_list,
    booted_uefi,
    esp_uuids,
    first_line,
    initrd_record,
)
from .bootcfg import write_bootcfg
from .grub import set_grub_default, update_grub
from .state import TWIN_STATE

ESP_DIR = f"{TWIN_STATE}/esp"  # files the twin keeps of each ESP's vfat (GRUB: grub/grubenv)

# --- refresh (zz-proxmox-boot) ---


def refresh(root: Path, out: Out, hook: str | None = None) -> None:
    """`proxmox-boot-tool refresh [--hook <name>]`: run the kernel postinst hooks."""
    hooks = ["proxmox-auto-removal", "zz-proxmox-boot"]
    if hook is not None:
        if hook not in hooks:
            out.err(f"E: '{hook}' is not a valid hook script name.")
            raise Exit(1)
        hooks = [hook]
    for script in hooks:
        path = root / "etc/kernel/postinst.d" / script
        if not (path.is_file() and os.access(path, os.X_OK)):
            out.err(f"Hook script '{script}' not found or not executable, skipping.")
            continue
        out.out(f"Running hook script '{script}'..")
        if script == "zz-proxmox-boot":
            zz_proxmox_boot(root, out, "postinst", "")


def zz_proxmox_boot(root: Path, out: Out, phase: str, version: str) -> None:
    """/etc/kernel/{postinst,postrm}.d/zz-proxmox-boot <version>."""
    out.out(
        f"Re-executing '/etc/kernel/{phase}.d/zz-proxmox-boot' in new private mount namespace.."
    )
    update_esps(root, out, version if phase == "postinst" else "")


def _esp_cmdline(root: Path, out: Out) -> str:
    cmdline_file = root / KERNEL_CMDLINE
    if cmdline_file.exists():
        cmdline = " ".join(first_line(root, KERNEL_CMDLINE).split())  # echo ${CMDLINE}
        if "root=" not in cmdline:
            out.err("No root= parameter in /etc/kernel/cmdline found!")
            raise Exit(1)
        return cmdline
    out.err("No /etc/kernel/cmdline found - falling back to /proc/cmdline")
    try:
        proc = (root / "proc/cmdline").read_text()
    except FileNotFoundError:
        proc = ""
    return re.sub(r"\binitrd=([0-9a-zA-Z\\/.-])*\s*", "", proc).strip()


def update_esps(root: Path, out: Out, install_version: str = "") -> None:
    uuids = esp_uuids(root)
    if uuids is None:
        out.err(f"No /{ESP_LIST} found, skipping ESP sync.")
        _check_grub_efi_package(root, out)
        return
    grub_mode = grub_on_esp(root)
    cmdline = "" if grub_mode else _esp_cmdline(root, out)
    kvers = boot_kernel_list(root, install_version)
    esps = _load_esps(root)
    for uuid in uuids:
        if not re.search(r"[0-9a-fA-F]{4}-[0-9a-fA-F]{4}", uuid):
            out.err(f"WARN: {uuid} read from /{ESP_LIST} does not look like a VFAT-UUID - skipping")
            continue
        out.err(f"Copying and configuring kernels on /dev/disk/by-uuid/{uuid}")
        synced = []
        for kver in kvers:
            if not (root / f"boot/vmlinuz-{kver}").is_file():
                out.err(f"No linux-image /boot/vmlinuz-{kver} found - skipping")
                continue
            if not (root / f"boot/initrd.img-{kver}").is_file():
                out.err(f"No initrd-image /boot/initrd.img-{kver} found - skipping")
                continue
            out.err(f"\tCopying kernel and creating boot-entry for {kver}")
            synced.append(kver)
        old = esps.get(uuid, {})
        for kver in old.get("versions", []):  # type: ignore[union-attr]
            if not any(kver in k for k in kvers):  # the hook greps, so substrings count
                out.err(f"\tRemoving old version {kver}")
        pinned = first_line(root, PINNED_KERNEL_CONF)
        if (root / NEXT_BOOT_PIN).exists():
            pinned = first_line(root, NEXT_BOOT_PIN)
        if grub_mode:  # grub-install made <ESP>/grub/grubenv
            ensure_grubenv(root / ESP_DIR / uuid / "grub/grubenv")
        else:
            default = f"proxmox-{pinned}.conf" if pinned else "proxmox-*"
            write_systemd_boot_esp(root, root / ESP_DIR / uuid, synced, cmdline, default)
        esps[uuid] = {
            "mode": "grub" if grub_mode else "uefi",
            "versions": sorted(synced),  # `ls -1` of EFI/proxmox
            "default": f"proxmox-{pinned}.conf" if pinned else "proxmox-*",
            "cmdline": cmdline,
            "initrd": {k: initrd_record(root, k) for k in synced},
            "synced_at": time.time(),
        }
    _write_json(root / ESP_STATE, esps)
    if grub_mode:  # zz-proxmox-boot: set_grub_default from the pins, then update-grub per ESP
        pin = first_line(root, NEXT_BOOT_PIN) or first_line(root, PINNED_KERNEL_CONF)
        set_grub_default(root, out, pin)
        update_grub(root, out, esps=[u for u in uuids if u in esps])
        for uuid in uuids:  # the ESP was bind-mounted on /boot: its own grub.cfg and kernels
            if uuid in esps:
                write_grub_esp(root, root / ESP_DIR / uuid, list(esps[uuid]["versions"]))
        return
    _write_bootcfg_esp(root, esps, uuids)


LOADER_TITLE = "Proxmox Virtual Environment"


def write_systemd_boot_esp(
    root: Path, esp: Path, kernels: list[str], cmdline: str, default: str
) -> None:
    """What zz-proxmox-boot leaves on a systemd-boot ESP (docs/reference/trial-boot.md §1.1): per kernel
    EFI/proxmox/<kver>/{vmlinuz,initrd.img}-<kver> and loader/entries/proxmox-<kver>.conf; other
    kernels' entries and directories removed; loader.conf's `default` from the pins."""
    entries, kdir = esp / "loader/entries", esp / "EFI/proxmox"
    entries.mkdir(parents=True, exist_ok=True)
    kdir.mkdir(parents=True, exist_ok=True)
    for old in entries.glob("proxmox-*.conf"):
        if old.name.removeprefix("proxmox-").removesuffix(".conf") not in kernels:
            old.unlink()
    for old in kdir.iterdir():
        if old.is_dir() and old.name not in kernels:
            shutil.rmtree(old)
    for kver in kernels:
        (kdir / kver).mkdir(exist_ok=True)
        for name in (f"vmlinuz-{kver}", f"initrd.img-{kver}"):
            shutil.copyfile(root / "boot" / name, kdir / kver / name)
        (entries / f"proxmox-{kver}.conf").write_text(
            f"title    {LOADER_TITLE}\nversion  {kver}\noptions   {cmdline}\n"
            f"linux    /EFI/proxmox/{kver}/vmlinuz-{kver}\n"
            f"initrd   /EFI/proxmox/{kver}/initrd.img-{kver}\n"
        )
    (esp / "loader/loader.conf").write_text(f"timeout 3\ndefault {default}\n")


def write_grub_esp(root: Path, esp: Path, kernels: list[str]) -> None:
    """A GRUB ESP after refresh: the kernels at its top (it is GRUB's /boot) and grub/grub.cfg."""
    esp.mkdir(parents=True, exist_ok=True)
    for old in esp.glob("vmlinuz-*"):
        if old.name.removeprefix("vmlinuz-") not in kernels:
            old.unlink()
            (esp / old.name.replace("vmlinuz-", "initrd.img-", 1)).unlink(missing_ok=True)
    for kver in kernels:
        for name in (f"vmlinuz-{kver}", f"initrd.img-{kver}"):
            shutil.copyfile(root / "boot" / name, esp / name)
    cfg = (root / "boot/grub/grub.cfg").read_text()
    (esp / "grub").mkdir(exist_ok=True)
    (esp / "grub/grub.cfg").write_text(
        cfg.replace("\tlinux\t/boot/", "\tlinux\t/").replace("\tinitrd\t/boot/", "\tinitrd\t/")
    )


def grub_on_esp(root: Path) -> bool:
    """GRUB, not systemd-boot, on the ESPs (`proxmox-boot-tool init <part> grub`)."""
    try:
        return bool(json.loads((root / TWIN_STATE / "pve.json").read_text()).get("grub_on_esp"))
    except (FileNotFoundError, ValueError):
        return False


def ensure_grubenv(path: Path) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        body = "# GRUB Environment Block\n"
        path.write_text(body + "#" * (1024 - len(body)))


def _check_grub_efi_package(root: Path, out: Out) -> None:
    if (
        booted_uefi(root)
        and not (root / "usr/share/doc/grub-efi-amd64/changelog.Debian.gz").exists()
    ):
        out.err("System booted in EFI-mode but grub-efi-amd64 meta-package not installed!")
        out.err("Install grub-efi-amd64 to get updates.")


def _write_bootcfg_esp(root: Path, esps: dict[str, dict[str, object]], uuids: list[str]) -> None:
    """The firmware boots the first ESP; its loader.conf `default` picks the entry."""
    esp = next((esps[u] for u in uuids if u in esps), None)
    versions: list[str] = list(esp["versions"]) if esp else []  # type: ignore[arg-type]
    options = str(esp["cmdline"]) if esp else ""
    write_bootcfg(
        root,
        loader="systemd-boot",
        kernels=versions,
        entries={v: options for v in versions},
        initrd=dict(esp["initrd"]) if esp else {},  # type: ignore[call-overload]
        written_by="proxmox-boot-tool refresh",
    )
