"""Hardware-facing tools of the twin, stdlib only; one entry per tool: main(tool, argv) -> exit code.

Installed as the package /usr/lib/gpuhost-twin/hwshim next to the hwsim package; each tool is a
three-line wrapper (see hardware.py). $TWIN_ROOT (default "/") is the machine's root.

One module per tool family: nvidia_smi (+ smi_text), lspci, kmod (lsmod, modprobe, modinfo,
depmod), nvidia_modprobe, kernel (uname, dmesg), bootctl (EFI variables), esp_mount (the ESPs), fabric (the NVSwitch fabric), storage (zpool, pvesm);
common holds what they share.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

# tool -> (module, function): a tool imports only its own module (every shim call is a fresh
# python3, and the twin's tests and deploys make thousands of them).
TOOLS = {
    "nvidia-smi": ("nvidia_smi", "nvidia_smi"),
    "dmesg": ("kernel", "dmesg"),
    "lspci": ("lspci", "lspci"),
    "lsmod": ("kmod", "lsmod"),
    "modprobe": ("kmod", "modprobe"),
    "modinfo": ("kmod", "modinfo"),
    "depmod": ("kmod", "depmod"),
    "nvidia-modprobe": ("nvidia_modprobe", "nvidia_modprobe"),
    "uname": ("kernel", "uname"),
    "bootctl": ("bootctl", "bootctl"),
    "mount": ("esp_mount", "mount"),
    "umount": ("esp_mount", "umount"),
    "journalctl": ("journal", "journalctl"),
    "findmnt": ("findmnt", "findmnt"),
    "gpuhost-twin-fabric": ("fabric", "fabric"),
    "zpool": ("storage", "zpool"),
    "pvesm": ("storage", "pvesm"),
}


def tool_function(tool: str) -> Callable[..., int]:
    module, function = TOOLS[tool]
    return getattr(importlib.import_module(f".{module}", __name__), function)  # type: ignore[no-any-return]


MUTATING = ("modprobe", "nvidia-modprobe", "gpuhost-twin-fabric")


def main(tool: str, argv: list[str]) -> int:
    run = tool_function(tool)
    if tool in MUTATING:
        from .common import hwsim, root

        with hwsim.locked(root()) as lock:
            return run(argv, lock) if tool == "modprobe" else run(argv)
    return run(argv)
