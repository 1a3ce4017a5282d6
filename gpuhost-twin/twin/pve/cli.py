"""Entry points of the twin's Proxmox tools: pct, qm, pvesh, proxmox-boot-tool, update-grub,
update-initramfs, mkinitramfs (stdlib only; installed into the twin by twin.pve.install).

One module per tool family: pct_qm (pct, qm), pvesh, boot_commands (proxmox-boot-tool,
update-grub, update-initramfs, kernel hooks); clihandler parses arguments like pve-common's
PVE::JSONSchema::get_options / PVE::CLIHandler. Output formats are pct.pm / qm.pm / pvesh's
(docs/reference/formats.md §2-§4).

The twin's root comes from $TWIN_ROOT (default "/"), so tests can run the tools on a directory.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from . import state
from .clihandler import Output

# --- dispatch ---

# tool -> (module, function): each tool is a fresh python3 that imports only its own family.
_TOOLS = {
    "pct": ("pct_qm", "guest_tool"),
    "qm": ("pct_qm", "guest_tool"),
    "pvesh": ("pvesh", "pvesh"),
    "proxmox-boot-tool": ("boot_commands", "boot_tool"),
    "update-grub": ("boot_commands", "update_grub"),
    "update-initramfs": ("boot_commands", "update_initramfs"),
    "mkinitramfs": ("boot_commands", "mkinitramfs"),
    "kernel-hook": ("boot_commands", "kernel_hook"),
    "pveversion": ("versions", "pveversion"),
}


def tool_function(tool: str) -> Callable[[Path, list[str], Output], int]:
    module, name = _TOOLS[tool]
    function = getattr(importlib.import_module(f".{module}", __package__), name)
    if tool in ("pct", "qm"):
        kind = "lxc" if tool == "pct" else "qemu"
        return lambda root, argv, out: function(kind, root, argv, out)  # type: ignore[no-any-return]
    return function  # type: ignore[no-any-return]


def run(tool: str, argv: list[str], root: Path | None = None) -> tuple[int, str, str]:
    """Run one tool in-process: (exit status, stdout, stderr)."""
    root = root if root is not None else Path(os.environ.get("TWIN_ROOT", "/"))
    out = Output()
    state.drain_warnings()
    rc = tool_function(tool)(root, argv, out)
    warnings = "".join(f"{w}\n" for w in state.drain_warnings())  # perl warns while parsing
    return rc, "".join(out.stdout), warnings + "".join(out.stderr)


def main(tool: str, argv: list[str] | None = None) -> int:
    rc, stdout, stderr = run(tool, sys.argv[1:] if argv is None else argv)
    sys.stdout.write(stdout)
    sys.stdout.flush()
    sys.stderr.write(stderr)
    return rc
