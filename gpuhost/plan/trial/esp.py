"""Commands on the boot loader's files that trial boots share: entry ids, an ESP mounted for a
command, checks of loader.conf and grub.cfg, GRUB environment blocks (docs/reference/trial-boot.md §1-§2). Pure."""

from __future__ import annotations

import shlex

from gpuhost.observe.boot import EFIVARS, LOADER_GUID

ESP_MOUNTS = "/run/gpuhost/esp"  # never /var/tmp/espmounts: proxmox-boot-tool mounts there


def systemd_boot_entry(kernel: str) -> str:
    """The entry id systemd-boot matches: the lower-cased file name with .conf (§1.2)."""
    return f"proxmox-{kernel}.conf".lower()


def grub_entry(kernel: str, devid: str) -> str:
    """The GRUB id path of the kernel's entry in the Advanced submenu (§2.2)."""
    return f"gnulinux-advanced-{devid}>gnulinux-{kernel}-advanced-{devid}"


def sh_quote(value: str) -> str:
    return shlex.quote(value)


def efivar(name: str) -> str:
    return f"{EFIVARS}/{name}-{LOADER_GUID}"


def efivar_is(name: str, value: str) -> str:
    # efivarfs: 4 attribute bytes, then UTF-16LE; for an ASCII id dropping NULs gives the text.
    # Read as a stream: efivarfs files are regular but refuse lseek (fs/efivarfs/file.c,
    # .llseek = no_llseek), so `tail -c +5 FILE`, which seeks on a regular file, fails there
    # ("cannot seek to relative offset 4", seen on real efivarfs in tests/vm).
    return f"test \"$(cat {efivar(name)} | tail -c +5 | tr -d '\\000')\" = {sh_quote(value)}"


def on_esp(uuid: str, body: str) -> str:
    """Run ``body`` with the ESP mounted at ``$M`` (a private directory), unmounting after."""
    m = f"{ESP_MOUNTS}/{uuid}"
    return (
        f'M={sh_quote(m)}; mkdir -p "$M" && mount -t vfat /dev/disk/by-uuid/{sh_quote(uuid)} "$M" && '
        f'{{ {body}; }}; rc=$?; umount "$M" 2>/dev/null; rmdir "$M" 2>/dev/null; [ "$rc" -eq 0 ]'
    )


def free_at_least(path: str, size: int) -> str:
    return f'test "$(df -B1 --output=avail {path} | tail -n 1)" -ge {size}'


def default_is(entry: str) -> str:
    return (
        f'[ "$(awk \'$1 == "default" {{print $2}}\' "$M/loader/loader.conf")" = {sh_quote(entry)} ]'
    )


def grub_default_is(entry: str, cfg: str) -> str:
    line = f'set default="{entry}"'
    return f"grep -qF {sh_quote(line)} {cfg}"


def grub_has(kernel: str, devid: str, cfg: str) -> str:
    menuentry_id = f"'gnulinux-{kernel}-advanced-{devid}'"
    return f"grep -qF {sh_quote(menuentry_id)} {cfg}"


def next_entry_is(entry: str, env: str) -> str:
    return f"grub-editenv {env} list | grep -qxF {sh_quote(f'next_entry={entry}')}"


def no_next_entry(env: str) -> str:
    # GRUB's save_env leaves "next_entry=" (empty) behind after consuming it.
    return f"! grub-editenv {env} list | grep -q '^next_entry=.'"
