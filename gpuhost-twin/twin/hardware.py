"""Install a profile's simulated hardware into a fresh twin root (a Debian 12 tree).

``install(root, profile)`` writes the profile, the shims and the factory state of the machine
(kernels, boot configuration); ``boot.simulate_boot`` then brings it up.

Shims and how they win over real binaries:
- every tool is a small python3 wrapper in /usr/local/bin (first in PATH for root and users:
  /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin), importing
  the packages /usr/lib/gpuhost-twin/hwshim and hwsim;
- tools that a Debian package ships (uname: coreutils; dmesg: util-linux; lsmod, modprobe, modinfo, depmod: kmod;
  lspci: pciutils) are also replaced at their packaged path with `dpkg-divert --local --rename`
  (the real one stays as <path>.distrib), so absolute paths and package upgrades hit the shim;
- nvidia-smi and nvidia-modprobe also go to /usr/bin, where NVIDIA's installer puts them; if a
  real driver install overwrites those, /usr/local/bin still comes first.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from twin import boot, bytecode, hwsim, kernel_choice, modbuild
from twin.profile import Kernel, Profile

SHIM_DIR = "usr/lib/gpuhost-twin"
TOOLS = (
    "nvidia-smi",
    "nvidia-modprobe",
    "lspci",
    "lsmod",
    "modprobe",
    "modinfo",
    "depmod",
    "uname",
    "dmesg",
    "bootctl",
    "mount",
    "umount",
    "journalctl",
    "findmnt",
    "gpuhost-twin-fabric",
    "zpool",
    "pvesm",
)
# Packaged paths (dpkg's view, before usrmerge) that get diverted when the package is installed.
PACKAGED = {
    "uname": ["/bin/uname"],
    "dmesg": ["/bin/dmesg"],
    "lsmod": ["/sbin/lsmod", "/bin/lsmod"],
    "modprobe": ["/sbin/modprobe"],
    "modinfo": ["/sbin/modinfo"],
    "depmod": ["/sbin/depmod"],
    "lspci": ["/usr/bin/lspci"],
    "nvidia-smi": ["/usr/bin/nvidia-smi"],
    "nvidia-modprobe": ["/usr/bin/nvidia-modprobe"],
    "bootctl": ["/usr/bin/bootctl"],  # package systemd-boot
    "mount": [],  # only /usr/local/bin's: other mounts go to the real /bin/mount
    "umount": [],
    "journalctl": [],  # the previous boot's kernel log; the rest goes to /bin/journalctl
    "findmnt": [],  # the disk layout of the profile's install (the overlay is the twin's own)
    "gpuhost-twin-fabric": [],  # the NVSwitch driver calls of nv-fabricmanager (stand-in)
    "zpool": ["/sbin/zpool"],  # zfsutils-linux; the pools of the profile's disks
    "pvesm": ["/usr/sbin/pvesm"],  # pve-storage's CLI: `pvesm status` over storage.cfg
}
# -S: no site module (the shims are stdlib only); a few ms of every call, and a read runs a dozen
WRAPPER = """#!/usr/bin/python3 -S
# gpuhost twin: simulated hardware tool; real one (if any) is {real}
import os, sys
sys.path.insert(0, os.path.join(os.environ.get("TWIN_ROOT", "/"), "{shim_dir}"))
import hwshim
sys.exit(hwshim.main("{tool}", sys.argv[1:]))
"""


def install(root: Path, profile: Profile) -> None:
    """Put the machine of profile into the Debian tree at root (idempotent)."""
    root = Path(root)
    boot.write_profile(root, profile)
    shim_dir = root / SHIM_DIR
    shim_dir.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).parent
    for package in ("hwsim", "hwshim"):
        bytecode.copy_package(here / package, shim_dir / package)
    for tool in TOOLS:
        if tool == "pvesm" and profile.start is not None and profile.start.packages == {}:
            continue  # libpve-storage-perl's CLI: a host captured without Proxmox VE has none
        _install_tool(root, tool)
    for kernel in profile.kernels:
        add_kernel(root, kernel)
    _boot_config(root, profile)
    storage_cfg = root / "etc/pve/storage.cfg"  # what the installer configured for its disks
    if not storage_cfg.exists():
        fstype = hwsim.storage.root_fs(profile.boot.model_dump())[1]
        _write(root, "etc/pve/storage.cfg", hwsim.storage.STORAGE_CFG[fstype])
    hostname = root / "etc/hostname"
    if not hostname.exists():
        hostname.parent.mkdir(parents=True, exist_ok=True)
        hostname.write_text(profile.hostname + "\n")
    (root / "var/log").mkdir(parents=True, exist_ok=True)


def _install_tool(root: Path, tool: str) -> None:
    packaged = [p for p in PACKAGED[tool] if _exists(root, p)]
    for path in packaged:
        _divert(root, path)
    targets = ["/usr/local/bin/" + tool, *(packaged or PACKAGED[tool][:1])]
    for target in dict.fromkeys(targets):
        dest = _resolve(root, target)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        real = f"{packaged[0]}.distrib" if packaged else "none"
        dest.write_text(WRAPPER.format(tool=tool, shim_dir=SHIM_DIR, real=real))
        os.chmod(dest, 0o755)


def _resolve(root: Path, path: str) -> Path:
    """root + path, following the rootfs' own usrmerge links (/bin -> usr/bin) inside root."""
    parts = Path(path.lstrip("/")).parts
    current = root
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink():
            target = os.readlink(current)
            current = (
                (root / target.lstrip("/")) if target.startswith("/") else current.parent / target
            )
    return current / parts[-1]


def _exists(root: Path, path: str) -> bool:
    dest = _resolve(root, path)
    return (dest.exists() or dest.is_symlink()) and "gpuhost twin" not in _head(dest)


def _head(path: Path) -> str:
    try:
        return path.read_bytes()[:200].decode(errors="replace")
    except OSError:
        return ""


def _divert(root: Path, path: str) -> None:
    """dpkg-divert the packaged binary aside (<path>.distrib) when the root has a dpkg database."""
    if not (root / "var/lib/dpkg/info").is_dir():
        return
    subprocess.run(
        [
            "dpkg-divert",
            f"--root={root}",
            "--local",
            "--rename",
            "--quiet",
            "--divert",
            f"{path}.distrib",
            "--add",
            path,
        ],
        check=True,
        capture_output=True,
    )


def add_kernel(root: Path, kernel: Kernel, headers: bool = True) -> None:
    """Install a simulated kernel: /boot image and config, /lib/modules/<ver>, headers.

    The initramfs is update-initramfs' business (the Proxmox shims write it as a record).

    The headers are Debian's, re-stamped as <ver> (twin/modbuild.py), so module builds inside the
    twin produce .ko files with this kernel's vermagic; skipped when the root has no Debian headers.
    """
    root = Path(root)
    v = kernel.version
    bootdir = root / "boot"
    bootdir.mkdir(parents=True, exist_ok=True)
    (bootdir / f"vmlinuz-{v}").write_bytes(b"gpuhost twin kernel image " + v.encode() + b"\n")
    system_map = f"ffffffff81000000 T _stext {v}\n"
    if kernel.acs_override:  # Proxmox's ACS patch: its early_param's setup function
        system_map += "ffffffff83a1c2e0 t pcie_acs_override_setup\n"
    (bootdir / f"System.map-{v}").write_text(system_map)
    (bootdir / f"config-{v}").write_text(
        f'# Linux/x86 {v} Kernel Configuration\nCONFIG_CC_VERSION_TEXT="{kernel.gcc}"\n'
        f"CONFIG_CC_IS_GCC=y\nCONFIG_MODULES=y\nCONFIG_MODVERSIONS=y\nCONFIG_VFIO_PCI=m\n"
    )
    moddir = root / f"lib/modules/{v}"
    moddir.mkdir(parents=True, exist_ok=True)
    deps = "".join(
        f"{m['path']}:{''.join(' ' + hwsim.IN_TREE[d]['path'] for d in m['deps'])}\n"
        for m in hwsim.IN_TREE.values()
        if kernel.in_tree_modules
    )
    if kernel.zfs:  # pve-kernel's debian/rules installs them into zfs/, depmod indexes them
        deps += "zfs/zfs.ko: zfs/spl.ko\nzfs/spl.ko:\n"  # (like IN_TREE's, no files)
    (moddir / "modules.dep").write_text(deps)
    (moddir / "modules.builtin").write_text("kernel/drivers/pci/pcie/portdrv.ko\n")
    (moddir / "twin-kernel.json").write_text(json.dumps(kernel.model_dump(), indent=1) + "\n")
    debian = modbuild.debian_headers(root) if headers else None
    # a kernel named as the base's own Debian one (a capture of a twin lists it) has its headers
    if debian is not None and debian.name != f"linux-headers-{v}":
        modbuild.stamp_headers(root, v, root)
        build = moddir / "build"
        if build.is_symlink() or build.exists():
            build.unlink()
        build.symlink_to(f"/usr/src/linux-headers-{v}")


def _boot_config(root: Path, profile: Profile) -> None:
    """Factory boot configuration plus the bootloader's snapshot of it (boot.BOOTCFG)."""
    b = profile.boot
    if b.loader == "systemd-boot":
        _write(root, "etc/kernel/cmdline", (b.kernel_cmdline or "") + "\n")
        _write(root, "etc/kernel/proxmox-boot-uuids", "".join(u + "\n" for u in b.esp_uuids))
        options = b.kernel_cmdline or ""
    elif b.loader == "none":  # the hypervisor's command line; nothing in the machine holds it
        options = b.kernel_cmdline or ""
    else:
        _write(root, "etc/default/grub", b.default_grub or "")
        grub = boot.read_default_grub(root)
        options = " ".join(
            [
                "root=/dev/mapper/pve-root",
                "ro",
                grub.get("GRUB_CMDLINE_LINUX", ""),
                grub.get("GRUB_CMDLINE_LINUX_DEFAULT", ""),
            ]
        ).strip()
    kernels = sorted((k.version for k in profile.kernels), key=hwsim.version_key)
    snapshot = {
        "loader": b.loader,
        "cmdline": " ".join(options.split()),
        "kernel_default": None,
        "kernels": kernels,
        "grub_on_esp": list(b.esp_uuids) if b.grub_on_esp else [],
        "written_by": "gpuhost twin install",
        "written_at": 0.0,
    }
    if not (root / boot.BOOTCFG).exists():
        _write(root, boot.BOOTCFG, json.dumps(snapshot, indent=1, sort_keys=True) + "\n")
    if b.loader == "systemd-boot" or b.grub_on_esp:  # the ESP partitions (their vfat's files)
        for uuid in b.esp_uuids:
            (root / kernel_choice.ESP_DIR / uuid).mkdir(parents=True, exist_ok=True)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
