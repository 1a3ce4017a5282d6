"""The twin's simulated hardware, stdlib only: it runs outside the twin (boot) and inside it (shims).

Copied into the twin as the package /usr/lib/gpuhost-twin/hwsim. Every path is under a root prefix
(``Hw(root)``; the shims take it from $TWIN_ROOT, default "/"), so tests run it on a temp dir.

Files it owns under the root:
    /etc/gpuhost-twin/profile.json     the hardware profile (twin/profile.py, dumped by alias)
    /var/lib/gpuhost-twin/hw.json      live state: booted kernel, cmdline, loaded modules and their
                                       parameters, majors, per-BDF binding, why nvidia did not load
    /var/log/twin-dmesg                the kernel log of this boot (dmesg-style lines)
    /proc/{cmdline,version,modules,devices,uptime,meminfo,cpuinfo,driver/nvidia/...}
    /proc/sys/kernel/random/boot_id
    /sys/{bus/pci,devices/pci*,kernel/iommu_groups,module,devices/system/node}
    /dev/nvidia*, /dev/nvidia-caps/*   real character device nodes, made only by nvidia-modprobe
    /sys/firmware/efi/efivars/*        EFI variables in efivarfs format (UEFI profiles; efivars)

Module loading rules (the twin's kernel): an out-of-tree module (nvidia*) loads only from a real
.ko under /lib/modules/<booted>/ (updates/ first, like depmod's default search order) whose
vermagic equals the booted kernel's and whose .comment GCC release equals the one that built the
kernel (Debian revisions are ignored: 12.2.0-14 and 12.2.0-14+deb12u1 are one toolchain); nvidia
also needs /lib/firmware/nvidia/<version>/gsp_*.bin. In-tree modules come from IN_TREE.

Modules: machine (state, kernels, lock), modules (modprobe's kernel side), modprobe_conf (what
kmod reads: modprobe.d, the command line), pci (sysfs PCI tree, binding), views (/proc, /sys,
/dev as the kernel shows them), rm (what the driver tells libcuda), kofile (.ko files), catalog
(tables), efivars (EFI variables, NVRAM), grubenv (GRUB's environment block).
"""

from __future__ import annotations

from pathlib import Path

from . import efivars, grubenv, storage
from .catalog import (
    BRIDGE_DRIVER,
    DEFAULT_BLOCK,
    DEFAULT_CHAR,
    DYNAMIC_MAJORS,
    IN_TREE,
    MODULE_DIRS,
    NVIDIA_ADDRS,
    NVIDIA_DEPS,
    NVIDIA_PARAMS,
    NVIDIA_SIZES,
    UVM_PARAMS,
    VENDORS,
)
from .kofile import gcc_release, ko_info, norm, read_elf_sections
from .machine import (
    DMESG,
    PROFILE,
    STATE,
    gpu_uuid,
    locked,
    mknod,
    new_boot_id,
    refresh_uptime,
    version_key,
)
from .modules import KernelModules
from .pci import (
    PciBinding,
    _apply_sysfs_writes,
    add_new_id,
    bind_device,
    layout_pci,
    sysfs_path,
    unbind_device,
)
from .views import KernelViews

__all__ = [
    "BRIDGE_DRIVER",
    "DEFAULT_BLOCK",
    "DEFAULT_CHAR",
    "DMESG",
    "DYNAMIC_MAJORS",
    "IN_TREE",
    "MODULE_DIRS",
    "NVIDIA_ADDRS",
    "NVIDIA_DEPS",
    "NVIDIA_PARAMS",
    "NVIDIA_SIZES",
    "PROFILE",
    "STATE",
    "UVM_PARAMS",
    "VENDORS",
    "Hw",
    "add_new_id",
    "apply_sysfs_writes",
    "bind_device",
    "efivars",
    "gcc_release",
    "gpu_uuid",
    "grubenv",
    "ko_info",
    "layout_pci",
    "locked",
    "mknod",
    "new_boot_id",
    "norm",
    "read_elf_sections",
    "refresh_uptime",
    "storage",
    "sysfs_path",
    "unbind_device",
    "version_key",
]


class Hw(KernelModules, PciBinding, KernelViews):
    """The simulated machine under one root; load state, change it, save it."""


def apply_sysfs_writes(root: str | Path) -> bool:
    """Apply writes to the plain sysfs control files (see _apply_sysfs_writes), under the lock."""
    with locked(root):
        return _apply_sysfs_writes(Hw(root))
