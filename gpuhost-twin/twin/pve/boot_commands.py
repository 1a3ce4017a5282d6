"""The command lines of proxmox-boot-tool, update-grub, update-initramfs and the kernel package
hooks (stdlib only); the work is in bootloader, esp_sync, grub and initramfs."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from . import boot_functions as bf
from . import boot_status
from .clihandler import Output

# --- proxmox-boot-tool / update-grub / update-initramfs ---


def _lazy(name: str) -> ModuleType:
    """A sibling module, imported when a command needs it: `status` and `kernel list` run on
    every deploy's read and need none of the ESP, GRUB and initramfs code."""
    return importlib.import_module(f".{name}", __package__)


def _collected(out: Output, script: Callable[[bf.Out], int | None]) -> int:
    """Run one simulated script into collected output, handed to ``out`` afterwards: its exit
    status is what it returns (None: 0), or the status of the bf.Exit it stopped with."""
    bo = bf.Out()
    try:
        rc = script(bo) or 0
    except bf.Exit as exc:
        rc = exc.rc
    out.take(bo)
    return rc


def _boot_usage(sub: str | None, out: bf.Out) -> None:
    tool = bf.TOOL
    if sub is None:
        out.err(f"USAGE: {tool} <commands> [ARGS]")
        out.err("")
    lines = {
        "format": [f"  {tool} format <partition> [--force]"],
        "init": [f"  {tool} init <partition> [grub]"],
        "reinit": [f"  {tool} reinit"],
        "clean": [f"  {tool} clean [--dry-run]"],
        "refresh": [f"  {tool} refresh [--hook <name>]"],
        "kernel": [
            f"  {tool} kernel <add|remove> <kernel-version>",
            f"  {tool} kernel pin <kernel-version> [--next-boot]",
            f"  {tool} kernel unpin [--next-boot]",
            f"  {tool} kernel list",
        ],
        "status": [f"  {tool} status [--quiet]"],
        "help": [f"  {tool} help"],
    }
    for name, text in lines.items():
        if sub is None or sub == name:
            for line in text:
                out.err(line)


def boot_tool(root: Path, argv: list[str], out: Output) -> int:
    return _collected(out, lambda bo: _boot_tool(root, argv, bo))


def _boot_tool(root: Path, argv: list[str], bo: bf.Out) -> int:
    if not argv:
        _boot_usage(None, bo)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("format", "init", "reinit", "clean"):
        bo.err(f"E: '{cmd}' is not simulated by the gpuhost twin (ESPs are set up by its profile)")
        return 1
    if cmd == "refresh":
        if not rest:
            _lazy("esp_sync").refresh(root, bo)
        elif len(rest) == 2 and rest[0] == "--hook":
            _lazy("esp_sync").refresh(root, bo, rest[1])
        else:
            _boot_usage("refresh", bo)
            return 1
        return 0
    if cmd in ("kernel", "kernels"):
        if not rest:
            bo.err("E: subcommand is mandatory for 'kernel'.")
            bo.err("")
            _boot_usage("kernel", bo)
            return 1
        sub, nargs = rest[0], len(rest)
        arg = rest[1] if nargs > 1 else ""
        if sub == "add":
            _lazy("bootloader").add_kernel(root, bo, arg)
        elif sub == "remove":
            _lazy("bootloader").remove_kernel(root, bo, arg)
        elif sub == "list":
            boot_status.list_kernels(root, bo)
        elif sub == "pin" and nargs == 3 and rest[2] == "--next-boot":
            _lazy("bootloader").pin_kernel(root, bo, arg, next_boot=True)
            bo.out("Pinned for next boot only.")
        elif sub == "pin" and nargs == 2:
            _lazy("bootloader").pin_kernel(root, bo, arg, next_boot=False)
        elif sub == "unpin" and nargs == 2 and rest[1] == "--next-boot":
            _lazy("bootloader").unpin_kernel(root, bo, next_boot_only=True)
        elif sub == "unpin" and nargs == 1:
            _lazy("bootloader").unpin_kernel(root, bo, next_boot_only=False)
        elif sub in ("pin", "unpin"):
            _boot_usage("kernel", bo)
            return 1
        else:
            bo.err(f"E: invalid 'kernel' subcommand '{sub}'.")
            bo.err("")
            _boot_usage("kernel", bo)
            return 1
        return 0
    if cmd == "status":
        if rest == ["--quiet"]:
            boot_status.status(root, bo, quiet=True)
        elif not rest:
            boot_status.status(root, bo, quiet=False)
        else:
            _boot_usage("status", bo)
            return 1
        return 0
    if cmd == "help":
        _boot_usage(None, bo)
        return 0
    bo.err(f"Invalid/unknown command '{cmd}'.")
    bo.err("")
    _boot_usage(None, bo)
    return 1


def update_grub(root: Path, argv: list[str], out: Output) -> int:
    return _collected(out, lambda bo: _lazy("grub").update_grub(root, bo))


INITRAMFS_USAGE = "Usage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]"


def update_initramfs(root: Path, argv: list[str], out: Output) -> int:
    mode, version = None, None
    args = list(argv)
    while args:
        arg = args.pop(0)
        m = re.fullmatch(r"-k(.*)", arg)
        if m:
            version = m.group(1) or (args.pop(0) if args else None)
            if version is None:
                out.err(INITRAMFS_USAGE)
                return 2
        elif arg in ("-c", "-u", "-d"):
            mode = {"-c": "create", "-u": "update", "-d": "delete"}[arg]
        elif arg in ("-v", "-t"):
            continue
        elif arg == "-b":
            args = args[1:]
        else:
            out.err(INITRAMFS_USAGE)
            return 2
    if mode is None:
        out.err(INITRAMFS_USAGE)
        return 2
    if mode == "delete":
        targets = bf.installed_kernels(root) if version == "all" else [version or ""]
        for ver in targets:
            initrd = root / f"boot/initrd.img-{ver}"
            if initrd.exists():
                out.out(f"update-initramfs: Deleting /boot/initrd.img-{ver}")
                initrd.unlink()
        return 0
    return _collected(out, lambda bo: _lazy("initramfs").update_initramfs(root, bo, mode, version))


def mkinitramfs(root: Path, argv: list[str], out: Output) -> int:
    outfile, version, args = None, None, list(argv)
    while args:
        arg = args.pop(0)
        if arg == "-o" and args:
            outfile = args.pop(0)
        elif arg in ("-d", "-r", "-c", "-m") and args:
            args.pop(0)
        elif arg in ("-k", "-l", "-v"):
            continue
        elif not arg.startswith("-") and version is None:
            version = arg
        else:
            out.err(_lazy("initramfs").MKINITRAMFS_USAGE)
            return 2
    if outfile is None:
        out.err(_lazy("initramfs").MKINITRAMFS_USAGE)
        return 2
    version = version or bf.running_kernel(root)
    return _collected(out, lambda bo: _lazy("initramfs").mkinitramfs(root, bo, outfile, version))


def kernel_hook(root: Path, argv: list[str], out: Output) -> int:
    """argv: <phase> <hook name> <version> [<image>] (run-parts passes version and image)."""
    phase, name, version = [*argv, "", "", ""][:3]
    return _collected(
        out, lambda bo: _lazy("bootloader").kernel_hook(root, bo, phase, name, version)
    )
