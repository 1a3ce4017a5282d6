"""The twin's disks as Proxmox's installer leaves them, and what a kernel needs to use them.

Root file system (pve-installer Install.pm, docs/reference/trial-boot.md §0): ZFS (rpool/ROOT/pve-1) on hosts
whose ESPs proxmox-boot-tool manages, LVM `pve/root` for a plain GRUB install; a profile may
name another (``boot.root_fs``: a btrfs install also boots with systemd-boot).

Which kernel can do what is read from its files, as a real boot depends on them:
- ZFS: Proxmox's kernel package carries zfs.ko and spl.ko in /lib/modules/<release>/zfs/
  (proxmox/pve-kernel debian/rules, bookworm-6.14 L177-179, then depmod L206). A kernel built
  by `make bindeb-pkg` has none. With root=ZFS= the initramfs' zfs script cannot load the module
  ("Failed to load ZFS modules.", openzfs contrib/initramfs/scripts/zfs) and drops to
  initramfs-tools' panic(): that reboots after N seconds when panic=N is on the command line,
  else it waits at the (initramfs) prompt for ever. Data pools stay unimported.
- pcie_acs_override: the option exists only in kernels with Proxmox's patch (pve-kernel
  patches/kernel/0004-pci-Enable-overrides-for-missing-ACS-capabilities: an early_param whose
  setup function, pcie_acs_override_setup, is a symbol in System.map). Without it the kernel
  ignores the parameter and the IOMMU groups stay as the hardware makes them.
"""

from __future__ import annotations

import re
from pathlib import Path

ZFS_MODULE = re.compile(r"(^|/)zfs\.ko(\.xz|\.zst|\.gz)?:", re.M)
ACS_SYMBOL = b"pcie_acs_override"
# pve-installer's /etc/pve/storage.cfg per root file system (constructed from Install.pm)
STORAGE_CFG = {
    "zfs": "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup\n\n"
    "zfspool: local-zfs\n\tpool rpool/data\n\tsparse\n\tcontent images,rootdir\n",
    "btrfs": "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup\n\n"
    "btrfs: local-btrfs\n\tpath /var/lib/pve/local-btrfs\n\tcontent iso,vztmpl,backup,images,rootdir\n",
    "ext4": "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup\n\n"
    "lvmthin: local-lvm\n\tthinpool data\n\tvgname pve\n\tcontent rootdir,images\n",
}


def root_fs(boot: dict) -> tuple[str, str]:
    """(SOURCE, FSTYPE) of / as findmnt shows it."""
    fstype = boot.get("root_fs")
    if fstype is None:
        on_esp = boot.get("loader") == "systemd-boot" or boot.get("grub_on_esp")
        fstype = "zfs" if on_esp else "ext4"
    if fstype == "zfs":
        return "rpool/ROOT/pve-1", "zfs"
    if fstype == "btrfs":
        return "/dev/sda3", "btrfs"
    if boot.get("loader") == "none":  # a microVM's virtio disk (h200x1-boot-raw/findmnt_all)
        return "/dev/vda", fstype
    if boot.get("boot_on_lvm", True):
        return "/dev/mapper/pve-root", "ext4"
    return "/dev/sda2", "ext4"


def pools(profile: dict) -> list[dict]:
    """The machine's ZFS pools: the profile's, else rpool on a ZFS root."""
    listed = profile.get("zfs_pools")
    if listed is not None:
        return listed
    return [{"name": "rpool", "state": "ONLINE"}] if root_fs(profile["boot"])[1] == "zfs" else []


def kernel_has_zfs(root: Path, kernel: str) -> bool:
    moddir = Path(root) / f"lib/modules/{kernel}"
    dep = moddir / "modules.dep"
    if dep.exists() and ZFS_MODULE.search(dep.read_text()):
        return True
    return any(moddir.glob("**/zfs.ko*")) if moddir.is_dir() else False


def kernel_has_acs_override(root: Path, kernel: str) -> bool:
    system_map = Path(root) / f"boot/System.map-{kernel}"
    return system_map.exists() and ACS_SYMBOL in system_map.read_bytes()


def root_on_zfs(cmdline: str) -> bool:
    """The initramfs imports the root pool when the command line says root=ZFS=."""
    return any(w.startswith("root=ZFS=") for w in cmdline.split())
