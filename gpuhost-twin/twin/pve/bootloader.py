"""proxmox-boot-tool's kernel commands (list, add, remove, pin, unpin) and status, the kernel
package hooks, and proxmox-boot-cleanup at boot; the overview of the twin's boot tools (stdlib only).

Modules: boot_functions (shared files and helpers), esp_sync (refresh), grub (update-grub, pins
on GRUB), initramfs (update-initramfs), bootcfg (the snapshot the boot reads), this one.

Follows proxmox-kernel-helper's bin/proxmox-boot-tool, proxmox-boot/functions, zz-proxmox-boot
and proxmox-boot-sync (docs/reference/formats.md §5), GRUB's grub-mkconfig (sourcing /etc/default/grub and
/etc/default/grub.d/*.cfg) and initramfs-tools' update-initramfs.

The boot loader's view of the world changes only when Proxmox would write it: `refresh` (ESP
hosts, also run by update-initramfs through proxmox-boot-sync; on GRUB-on-ESP hosts it renders
GRUB's config for the ESPs) and `update-grub` (plain GRUB hosts, also run by `kernel pin/unpin`
there). Each writes <root>/var/lib/gpuhost-twin/bootcfg.json in the format twin/kernel_choice.py
defines (see its docstring): "loader", "cmdline" (entry options, without the initrd=/BOOT_IMAGE=
the loader adds), "kernel_default" (what the loader really holds), "kernels" (oldest first, newest
last), "written_by", "written_at"; plus "firmware", "kernel_pin", "next_boot_pin", "entries"
(options per kernel), "initrd" (the initramfs records synced to the ESP; null for GRUB, which reads
/boot at boot), "grub_devid" and "grub_on_esp" (GRUB).

--next-boot, per the source (docs/reference/trial-boot.md §5): proxmox-boot-tool writes the next-boot pin into
loader.conf `default` (systemd-boot) or GRUB_DEFAULT exactly like a permanent pin (it wins over
it); only proxmox-boot-cleanup.service, in a boot that reaches userspace (on_boot(), run by
twin.boot.simulate_boot after a boot that did not panic or hang), undoes it. So a trial kernel
that panics with panic=N is booted again and again. True one-shots: bootctl set-oneshot
(systemd-boot, twin/hwshim/bootctl.py) and GRUB's next_entry (twin/kernel_choice.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from .boot_functions import (
    ESP_LIST,
    MANUAL_KERNEL_LIST,
    NEXT_BOOT_PIN,
    PINNED_KERNEL_CONF,
    Exit,
    Out,
    boot_kernel_list,
    first_line,
)
from .boot_status import list_kernels, status  # noqa: F401 (the package's names)
from .esp_sync import (
    refresh,
    zz_proxmox_boot,
)
from .grub import (
    set_grub_default,
    update_grub,
)
from .initramfs import update_initramfs

KERNEL_HOOKS = {
    "postinst": ("initramfs-tools", "proxmox-auto-removal", "zz-proxmox-boot", "zz-update-grub"),
    "postrm": ("initramfs-tools", "proxmox-auto-removal", "zz-proxmox-boot", "zz-update-grub"),
}


def kernel_hook(root: Path, out: Out, phase: str, name: str, version: str) -> None:
    """What a kernel package's maintainer scripts run (`run-parts /etc/kernel/<phase>.d`)."""
    mode = os.environ.get("DEB_MAINT_PARAMS", "").split(" ")[0].strip("'")
    if mode not in ("", "configure" if phase == "postinst" else "remove"):
        return  # only on configure/remove, like the hooks themselves
    if name == "initramfs-tools":
        if phase == "postinst":
            sub = Out()  # INITRAMFS_TOOLS_KERNEL_HOOK=1: proxmox-boot-sync leaves it to zz-...
            update_initramfs(root, sub, "create", version, from_kernel_hook=True)
            out.stderr += sub.stdout + sub.stderr  # the hook sends update-initramfs to stderr
        else:
            initrd = root / f"boot/initrd.img-{version}"
            if initrd.exists():
                out.err(f"update-initramfs: Deleting /boot/initrd.img-{version}")
                initrd.unlink()
    elif name == "zz-proxmox-boot":
        zz_proxmox_boot(root, out, phase, version)
    elif name == "zz-update-grub" and (root / "boot/grub/grub.cfg").exists():
        update_grub(root, out)


# --- proxmox-boot-tool kernel ... / status ---


def _possible_versions(root: Path, out: Out) -> None:
    out.err("")
    out.err("Possible Proxmox kernel versions are:")
    out.err("\n".join(boot_kernel_list(root)))


def pin_kernel(root: Path, out: Out, ver: str, next_boot: bool) -> None:
    pin_file = NEXT_BOOT_PIN if next_boot else PINNED_KERNEL_CONF
    if not ver:
        out.err("E: <kernel-version> is mandatory")
        _possible_versions(root, out)
        raise Exit(1)
    if not (root / f"boot/vmlinuz-{ver}").exists():
        out.err(f"E: no kernel image found in /boot for '{ver}', not setting default.")
        _possible_versions(root, out)
        raise Exit(1)
    if (root / pin_file).exists():
        old = first_line(root, pin_file)
        if old != ver:
            out.out(f"Overriding previously pinned version '{old}' with '{ver}'")
    (root / pin_file).parent.mkdir(parents=True, exist_ok=True)
    (root / pin_file).write_text(ver + "\n")
    if (root / ESP_LIST).is_file():
        out.out(f"Set kernel '{ver}' in /{pin_file}. Use the 'refresh' command to update the ESPs.")
    else:
        pin_ver = first_line(root, NEXT_BOOT_PIN) or ver
        out.out(f"Setting '{pin_ver}' as grub default entry and running update-grub.")
        set_grub_default(root, out, pin_ver)
        update_grub(root, out)


def unpin_kernel(root: Path, out: Out, next_boot_only: bool) -> None:
    last_pin = first_line(root, NEXT_BOOT_PIN)
    (root / NEXT_BOOT_PIN).unlink(missing_ok=True)
    out.out(f"Removed /{NEXT_BOOT_PIN}.")
    if not next_boot_only:
        last_pin = first_line(root, PINNED_KERNEL_CONF) or last_pin
        (root / PINNED_KERNEL_CONF).unlink(missing_ok=True)
        out.out(f"Removed /{PINNED_KERNEL_CONF}.")
    if (root / ESP_LIST).is_file():
        if last_pin:
            out.out(f"Unpinned kernel '{last_pin}'. Use the 'refresh' command to update the ESPs.")
    else:
        out.out("Reset default grub entry and running update-grub.")
        set_grub_default(root, out, first_line(root, PINNED_KERNEL_CONF))
        update_grub(root, out)


def add_kernel(root: Path, out: Out, ver: str) -> None:
    if not ver:
        out.err("E: <kernel-version> is mandatory")
        out.err("")
        raise Exit(1)
    if not (root / f"boot/vmlinuz-{ver}").exists():
        out.err(f"E: no kernel image found in /boot for '{ver}', not adding.")
        raise Exit(1)
    path = root / MANUAL_KERNEL_LIST
    entries = set(path.read_text().split("\n")) if path.exists() else set()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}\n" for k in sorted((entries | {ver}) - {""})))
    out.out(
        f"Added kernel '{ver}' to manual kernel list. Use the 'refresh' command to update the ESPs."
    )


def remove_kernel(root: Path, out: Out, ver: str) -> None:
    if not ver:
        out.err("E: <kernel-version> is mandatory")
        out.err("")
        raise Exit(1)
    path = root / MANUAL_KERNEL_LIST
    entries = path.read_text().split("\n") if path.exists() else []
    if ver in entries:
        path.write_text("".join(f"{k}\n" for k in entries if k and k != ver))
        out.out(
            f"Removed kernel '{ver}' from manual kernel list. Use the 'refresh' command to update the ESPs."
        )
    else:
        out.out(f"Kernel '{ver}' not found in manual kernel list.")


# --- boot-time hook ---


def on_boot(root: Path) -> Out:
    """proxmox-boot-cleanup.service: after a boot, drop the one-shot pin and refresh.

    Call after the simulated boot has chosen the kernel (ConditionPathExists=next-boot-pin).
    """
    out = Out()
    if not (root / NEXT_BOOT_PIN).exists():
        return out
    try:
        unpin_kernel(root, out, next_boot_only=True)
        refresh(root, out)
    except Exit as exc:
        out.rc = exc.rc
    return out
