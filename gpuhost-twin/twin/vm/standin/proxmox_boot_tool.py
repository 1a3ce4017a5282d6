#!/usr/bin/python3 -S
"""A stand-in of Proxmox's proxmox-boot-tool for the vm tier's real Debian systems (stdlib only).

No Proxmox package exists on these machines, and gpuhost pins, syncs and refreshes through this
tool on every loader. This one does on real disks what proxmox-kernel-helper 8.1.0 does
(src/bin/proxmox-boot-tool, src/proxmox-boot/{functions,zz-proxmox-boot,proxmox-boot-sync}):
real mounts of the ESPs (in a private mount namespace, as the tool re-executes itself under
`unshare`), real files on them, and Debian's real update-grub with the ESP bind-mounted on
/boot. The boot loaders, GRUB's environment block, the firmware and bootctl stay the real ones.
What it leaves out: `format`, `init`, `reinit`, `clean` and proxmox-auto-removal, which gpuhost
never calls (the images lay their ESPs out as `init` would: twin/vm/image.py). Installed with
pbt_functions.py in /usr/lib/gpuhost-standin (Python finds it beside the file a link resolves
to), linked as /usr/sbin/proxmox-boot-tool and as the kernel and initramfs hooks
(/etc/kernel/post{inst,rm}.d/zz-proxmox-boot, /etc/initramfs/post-update.d/proxmox-boot-sync),
told apart by the name they run under.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pbt_functions import (  # beside this file: /usr/lib/gpuhost-standin in the VM images
    ESP_LIST,
    HOOKSCRIPTS,
    MANUAL_KERNEL_LIST,
    NEXT_BOOT_PIN,
    PINNED_KERNEL_CONF,
    PMX_ESP_DIR,
    PMX_LOADER_CONF,
    TOOL,
    Exit,
    _mount,
    _umount,
    boot_kernel_list,
    esp_uuids,
    first_line,
    kernel_hook,
    reexec_in_mountns,
    run,
    say,
    set_grub_default,
    warn,
)

# --- proxmox-boot-tool ---------------------------------------------------------------------------


def refresh(hook: str | None = None) -> None:
    scripts = HOOKSCRIPTS
    if hook is not None:
        if hook not in HOOKSCRIPTS:
            warn(f"E: '{hook}' is not a valid hook script name.")
            raise Exit(1)
        scripts = (hook,)
    for script in scripts:
        path = Path(f"/etc/kernel/postinst.d/{script}")
        if path.is_file() and os.access(path, os.X_OK):
            say(f"Running hook script '{script}'..")
            env = {k: v for k, v in os.environ.items() if k != "PVE_EFIBOOT_UNSHARED"}
            if subprocess.run([str(path)], env=env).returncode != 0:
                raise Exit(1)
        else:
            warn(f"Hook script '{script}' not found or not executable, skipping.")


def _list_file(path: Path, add: str | None = None, remove: str | None = None) -> None:
    entries = set(path.read_text().split("\n")) if path.exists() else set()
    entries = (entries | ({add} if add else set())) - {remove, ""}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{e}\n" for e in sorted(entries)))


def list_kernels() -> None:
    kernels = boot_kernel_list()
    manual = (
        [k for k in MANUAL_KERNEL_LIST.read_text().split("\n") if k]
        if (MANUAL_KERNEL_LIST.exists())
        else []
    )
    kernels = [k for k in kernels if k not in manual]
    say("Manually selected kernels:")
    say("\n".join(manual) if manual else "None.")
    say("")
    say("Automatically selected kernels:")
    say("\n".join(kernels))
    for title, path in (
        ("Pinned kernel:", PINNED_KERNEL_CONF),
        ("Kernel pinned on next-boot:", NEXT_BOOT_PIN),
    ):
        if first_line(path):
            say("")
            say(title)
            say(first_line(path))


def _possible(message: str) -> None:
    warn(message)
    warn("")
    warn("Possible Proxmox kernel versions are:")
    warn("\n".join(boot_kernel_list()))
    raise Exit(1)


def pin_kernel(ver: str, pin_file: Path) -> None:
    if not ver:
        _possible("E: <kernel-version> is mandatory")
    if not Path(f"/boot/vmlinuz-{ver}").exists():
        _possible(f"E: no kernel image found in /boot for '{ver}', not setting default.")
    if pin_file.exists():
        old = first_line(pin_file)
        if old != ver:
            say(f"Overriding previously pinned version '{old}' with '{ver}'")
    pin_file.write_text(f"{ver}\n")
    if ESP_LIST.is_file():  # never interactive here: gpuhost runs it over SSH without a tty
        say(f"Set kernel '{ver}' in {pin_file}. Use the 'refresh' command to update the ESPs.")
    else:
        pin_ver = first_line(NEXT_BOOT_PIN) or ver
        say(f"Setting '{pin_ver}' as grub default entry and running update-grub.")
        set_grub_default(pin_ver)
        run("update-grub")


def unpin_kernel(next_boot_only: bool) -> None:
    last_pin = first_line(NEXT_BOOT_PIN)
    NEXT_BOOT_PIN.unlink(missing_ok=True)
    say(f"Removed {NEXT_BOOT_PIN}.")
    if not next_boot_only:
        last_pin = first_line(PINNED_KERNEL_CONF) or last_pin
        PINNED_KERNEL_CONF.unlink(missing_ok=True)
        say(f"Removed {PINNED_KERNEL_CONF}.")
    if ESP_LIST.is_file():
        if last_pin:
            say(f"Unpinned kernel '{last_pin}'. Use the 'refresh' command to update the ESPs.")
    else:
        say("Reset default grub entry and running update-grub.")
        set_grub_default(first_line(PINNED_KERNEL_CONF))
        run("update-grub")


def _status_detail(uuid: str) -> None:
    esp = _mount(uuid)
    if esp is None:
        return
    result = []
    if (esp / PMX_LOADER_CONF).is_file():
        if not (esp / PMX_ESP_DIR).is_dir():
            warn(f"/dev/disk/by-uuid/{uuid}/{PMX_ESP_DIR} does not exist")
        dirs = (
            sorted(p.name for p in (esp / PMX_ESP_DIR).iterdir())
            if (esp / PMX_ESP_DIR).is_dir()
            else []
        )
        result.append(f"uefi (versions: {', '.join(dirs)})")
    if (esp / "grub").is_dir():
        images = sorted(p.name.removeprefix("vmlinuz-") for p in esp.glob("vmlinuz-*"))
        result.append(f"grub (versions: {', '.join(images)})")
    say(f"{uuid} is configured with: {', '.join(result)}")
    _umount(esp)


def status(quiet: bool) -> None:
    uuids = esp_uuids()
    if uuids is None:
        if not quiet:
            warn(f"E: {ESP_LIST} does not exist.")
        raise Exit(2)
    if quiet:
        return
    booted = "uefi" if Path("/sys/firmware/efi").is_dir() else "legacy bios"
    say(f"System currently booted with {booted}")
    for uuid in uuids:
        _status_detail(uuid)


def main(argv: list[str]) -> int:
    name = Path(argv[0]).name
    if name == "zz-proxmox-boot":
        kernel_hook(argv)
        return 0
    if name == "proxmox-boot-sync":  # /etc/initramfs/post-update.d: a manual update-initramfs
        if not os.environ.get("INITRAMFS_TOOLS_KERNEL_HOOK"):
            refresh("zz-proxmox-boot")
        return 0
    args = argv[1:]
    cmd = args[0] if args else ""
    if cmd == "status":
        if args[1:] == ["--quiet"]:
            status(True)
        else:
            reexec_in_mountns()
            status(False)
    elif cmd == "refresh":
        refresh(args[2] if args[1:2] == ["--hook"] and len(args) == 3 else None)
    elif cmd in ("kernel", "kernels") and len(args) >= 2:
        sub = args[1]
        if sub == "add" and len(args) == 3:
            if not Path(f"/boot/vmlinuz-{args[2]}").exists():
                warn(f"E: no kernel image found in /boot for '{args[2]}', not adding.")
                return 1
            _list_file(MANUAL_KERNEL_LIST, add=args[2])
            say(
                f"Added kernel '{args[2]}' to manual kernel list. Use the 'refresh' command to update the ESPs."
            )
        elif sub == "remove" and len(args) == 3:
            if MANUAL_KERNEL_LIST.exists() and args[2] in MANUAL_KERNEL_LIST.read_text().split(
                "\n"
            ):
                _list_file(MANUAL_KERNEL_LIST, remove=args[2])
                say(
                    f"Removed kernel '{args[2]}' from manual kernel list. Use the 'refresh' command to update the ESPs."
                )
            else:
                say(f"Kernel '{args[2]}' not found in manual kernel list.")
        elif sub == "list":
            list_kernels()
        elif sub == "pin" and len(args) == 4 and args[3] == "--next-boot":
            pin_kernel(args[2], NEXT_BOOT_PIN)
            say("Pinned for next boot only.")
        elif sub == "pin" and len(args) == 3:
            pin_kernel(args[2], PINNED_KERNEL_CONF)
        elif sub == "unpin" and args[2:] in ([], ["--next-boot"]):
            unpin_kernel(next_boot_only=bool(args[2:]))
        else:
            warn(f"E: invalid 'kernel' subcommand '{sub}'.")
            return 1
    else:
        warn(f"USAGE: {TOOL} <commands> [ARGS]")
        return 0 if not cmd else 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except Exit as stop:
        sys.exit(stop.rc)
