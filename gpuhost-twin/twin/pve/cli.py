"""Entry points of the twin's Proxmox tools: pct, qm, pvesh, proxmox-boot-tool, update-grub,
update-initramfs, mkinitramfs (stdlib only; installed into the twin by twin.pve.install).

One module per tool family: pct_qm (pct, qm), pvesh, boot_commands (proxmox-boot-tool,
update-grub, update-initramfs, kernel hooks); clihandler parses arguments like pve-common's
PVE::JSONSchema::get_options / PVE::CLIHandler. Output formats are pct.pm / qm.pm / pvesh's
(docs/reference/formats.md §2-§4).

The twin's root comes from $TWIN_ROOT (default "/"), so tests can run the tools on a directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from . import config as cfg
from .boot_commands import boot_tool, kernel_hook, mkinitramfs, update_grub, update_initramfs
from .clihandler import Output
from .pct_qm import guest_tool
from .pvesh import pvesh

# --- dispatch ---

TOOLS: dict[str, Callable[[Path, list[str], Output], int]] = {
    "pct": lambda root, argv, out: guest_tool("lxc", root, argv, out),
    "qm": lambda root, argv, out: guest_tool("qemu", root, argv, out),
    "pvesh": pvesh,
    "proxmox-boot-tool": boot_tool,
    "update-grub": update_grub,
    "update-initramfs": update_initramfs,
    "mkinitramfs": mkinitramfs,
    "kernel-hook": kernel_hook,
}


def run(tool: str, argv: list[str], root: Path | None = None) -> tuple[int, str, str]:
    """Run one tool in-process: (exit status, stdout, stderr)."""
    root = root if root is not None else Path(os.environ.get("TWIN_ROOT", "/"))
    out = Output()
    cfg.drain_warnings()
    rc = TOOLS[tool](root, argv, out)
    warnings = "".join(f"{w}\n" for w in cfg.drain_warnings())  # perl warns while parsing
    return rc, "".join(out.stdout), warnings + "".join(out.stderr)


def main(tool: str, argv: list[str] | None = None) -> int:
    rc, stdout, stderr = run(tool, sys.argv[1:] if argv is None else argv)
    sys.stdout.write(stdout)
    sys.stdout.flush()
    sys.stderr.write(stderr)
    return rc
