"""The twin's simulated Proxmox layer: /etc/pve, pct/qm/pvesh, boot tools, the API.

Stdlib only: this package is copied into each twin (/usr/lib/gpuhost-twin/pve) where its shims
run under the twin's own python3.

    install(root, profile)      lay out /etc/pve, shims and the factory boot configuration
    on_boot(root)               proxmox-boot-cleanup.service; call after every simulated boot
    read_lxc(root, ctid)        a container's current config: devN entries and raw lxc.* keys
    lxc_device_rules(root, c)   devN resolved against the live nodes, as Proxmox does at start
    apply_pending(root, kind, vmid)  what a start applies first (pending changes)
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it. Resolved on first use (PEP 562): the shims (pct, qm,
# proxmox-boot-tool...) are fresh python3 processes that each need a few of these modules, not
# all of them.
_EXPORTS = {
    "Out": "boot_functions",
    "installed_kernels": "boot_functions",
    "KERNEL_HOOKS": "bootloader",
    "on_boot": "bootloader",
    "TWIN_STATE": "state",
    "apply_pending": "config_update",
    "ensure_grubenv": "esp_sync",
    "refresh": "esp_sync",
    "update_grub": "grub",
    "is_running": "guest_state",
    "set_running": "guest_state",
    "initramfs_record": "initramfs",
    "LxcConfig": "lxc_devices",
    "LxcDevice": "lxc_devices",
    "lxc_device_rules": "lxc_devices",
    "read_lxc": "lxc_devices",
    "install": "setup",
    "LIB": "setup",
    "SHIMS": "setup",
    "PACKAGES": "setup",
    "RELEASE_PACKAGES": "setup",
    "_register_packages": "setup",
}

__all__ = [
    "LxcConfig",
    "LxcDevice",
    "apply_pending",
    "install",
    "is_running",
    "lxc_device_rules",
    "on_boot",
    "read_lxc",
    "set_running",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
