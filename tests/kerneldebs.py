"""Kernel image packages for tests, built with the real dpkg-deb: what `make bindeb-pkg` of a
plain tree packs (image, config, System.map, modules), and, where asked, what Proxmox's
packaging adds (zfs.ko and spl.ko in lib/modules/<release>/zfs/, the ACS patch's symbol)."""

from __future__ import annotations

import subprocess
from pathlib import Path

GCC = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"
# What pve-kernel's maintainer scripts do (debian/proxmox-kernel.postinst.in, .postrm.in, in
# Perl there): index the modules and run the kernel hooks (initramfs-tools, proxmox-boot-tool's
# ESP sync), skipped in the installer; on removal run the postrm hooks and drop the initramfs.
POSTINST = """#!/bin/sh
set -e
[ "$1" = configure ] || exit 0
[ -e /proxmox_install_mode ] && exit 0
depmod @KVNAME@
if [ -d /etc/kernel/postinst.d ]; then
    run-parts --verbose --exit-on-error --arg=@KVNAME@ --arg=/boot/vmlinuz-@KVNAME@ \\
        /etc/kernel/postinst.d
fi
"""
POSTRM = """#!/bin/sh
set -e
[ "$1" = upgrade ] && exit 0
if [ -d /etc/kernel/postrm.d ]; then
    run-parts --verbose --exit-on-error --arg=@KVNAME@ --arg=/boot/vmlinuz-@KVNAME@ \\
        /etc/kernel/postrm.d
fi
rm -f /boot/initrd.img-@KVNAME@ /boot/initrd.img-@KVNAME@.bak /var/lib/initramfs-tools/@KVNAME@
"""


def kernel_deb(
    out: Path,
    release: str,
    zfs: bool,
    acs: bool,
    usr_merged: bool = False,
    gcc: str = GCC,
    proxmox: bool = False,
) -> Path:
    """A linux-image-<release> .deb in ``out``; ``usr_merged``: modules under usr/lib as
    pve-kernel's packaging puts them; ``proxmox``: named proxmox-kernel-<release> as
    pve-kernel's debian/rules names it (PMX_KERNEL_PKG), modules under usr/lib, with its
    maintainer scripts (POSTINST, POSTRM: on a twin, dpkg -i runs the kernel hooks)."""
    usr_merged = usr_merged or proxmox
    package = f"{'proxmox-kernel' if proxmox else 'linux-image'}-{release}"
    tree = out / f"tree-{package}-{int(zfs)}{int(acs)}"
    mods = tree / ("usr/lib" if usr_merged else "lib") / "modules" / release
    (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (tree / "boot").mkdir(exist_ok=True)
    (tree / "DEBIAN/control").write_text(
        f"Package: {package}\nVersion: {release}-1\nArchitecture: amd64\n"
        "Maintainer: gpuhost tests <root@localhost>\nDescription: test kernel\n"
    )
    if proxmox:
        for name, script in (("postinst", POSTINST), ("postrm", POSTRM)):
            (tree / "DEBIAN" / name).write_text(script.replace("@KVNAME@", release))
            (tree / "DEBIAN" / name).chmod(0o755)
    (tree / f"boot/vmlinuz-{release}").write_bytes(b"\x1f\x8b compressed image, no symbols")
    (tree / f"boot/config-{release}").write_text(
        f'CONFIG_CC_VERSION_TEXT="{gcc}"\nCONFIG_MODULES=y\n'
    )
    symbols = "ffffffff81000000 T _stext\n"
    if acs:
        symbols += "ffffffff83a1c2e0 t pcie_acs_override_setup\n"
    (tree / f"boot/System.map-{release}").write_text(symbols)
    (mods / "kernel/drivers/block").mkdir(parents=True, exist_ok=True)
    (mods / "kernel/drivers/block/loop.ko").write_bytes(b"\x7fELF")
    if zfs:
        (mods / "zfs").mkdir(exist_ok=True)
        for name in ("zfs", "spl"):
            (mods / f"zfs/{name}.ko").write_bytes(b"\x7fELF")
    deb = out / f"{package}_{release}-1_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def headers_deb(out: Path, release: str, proxmox: bool = False) -> Path:
    """The headers package beside :func:`kernel_deb`'s image (linux-headers-<release>, or
    proxmox-headers-<release>): the source tree's config and the modules' build link."""
    package = f"{'proxmox-headers' if proxmox else 'linux-headers'}-{release}"
    tree = out / f"tree-{package}"
    src = tree / f"usr/src/linux-headers-{release}"
    (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
    src.mkdir(parents=True, exist_ok=True)
    (tree / "DEBIAN/control").write_text(
        f"Package: {package}\nVersion: {release}-1\nArchitecture: amd64\n"
        "Maintainer: gpuhost tests <root@localhost>\nDescription: test kernel headers\n"
    )
    (src / ".config").write_text(f'CONFIG_CC_VERSION_TEXT="{GCC}"\nCONFIG_MODULES=y\n')
    deb = out / f"{package}_{release}-1_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb
