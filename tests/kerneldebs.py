"""Kernel image packages for tests, built with the real dpkg-deb: what `make bindeb-pkg` of a
plain tree packs (image, config, System.map, modules), and, where asked, what Proxmox's
packaging adds (zfs.ko and spl.ko in lib/modules/<release>/zfs/, the ACS patch's symbol)."""

from __future__ import annotations

import re
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


def _control(tree: Path, package: str, release: str, description: str) -> None:
    (tree / "DEBIAN/control").write_text(
        f"Package: {package}\nVersion: {release}-1\nArchitecture: amd64\n"
        f"Maintainer: gpuhost tests <root@localhost>\nDescription: {description}\n"
    )


def _pack(tree: Path, deb: Path) -> Path:
    """``tree`` packed into ``deb`` by the real dpkg-deb."""
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def kernel_deb(
    out: Path,
    release: str,
    zfs: bool,
    acs: bool,
    usr_merged: bool = False,
    gcc: str = GCC,
    proxmox: bool = False,
    config: str | None = None,
) -> Path:
    """A linux-image-<release> .deb in ``out``; ``usr_merged``: modules under usr/lib as
    pve-kernel's packaging puts them; ``proxmox``: named proxmox-kernel-<release> as
    pve-kernel's debian/rules names it (PMX_KERNEL_PKG), modules under usr/lib, with its
    maintainer scripts (POSTINST, POSTRM: on a twin, dpkg -i runs the kernel hooks); ``config``:
    the kernel's .config (default: its compiler and CONFIG_MODULES only)."""
    usr_merged = usr_merged or proxmox
    package = f"{'proxmox-kernel' if proxmox else 'linux-image'}-{release}"
    tree = out / f"tree-{package}-{int(zfs)}{int(acs)}"
    mods = tree / ("usr/lib" if usr_merged else "lib") / "modules" / release
    (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (tree / "boot").mkdir(exist_ok=True)
    _control(tree, package, release, "test kernel")
    if proxmox:
        for name, script in (("postinst", POSTINST), ("postrm", POSTRM)):
            (tree / "DEBIAN" / name).write_text(script.replace("@KVNAME@", release))
            (tree / "DEBIAN" / name).chmod(0o755)
    (tree / f"boot/vmlinuz-{release}").write_bytes(b"\x1f\x8b compressed image, no symbols")
    (tree / f"boot/config-{release}").write_text(
        config or f'CONFIG_CC_VERSION_TEXT="{gcc}"\nCONFIG_MODULES=y\n'
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
    return _pack(tree, deb)


def headers_deb(out: Path, release: str, proxmox: bool = False) -> Path:
    """The headers package beside :func:`kernel_deb`'s image (linux-headers-<release>, or
    proxmox-headers-<release>): the source tree's config and the modules' build link."""
    package = f"{'proxmox-headers' if proxmox else 'linux-headers'}-{release}"
    tree = out / f"tree-{package}"
    src = tree / f"usr/src/linux-headers-{release}"
    (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
    src.mkdir(parents=True, exist_ok=True)
    _control(tree, package, release, "test kernel headers")
    (src / ".config").write_text(f'CONFIG_CC_VERSION_TEXT="{GCC}"\nCONFIG_MODULES=y\n')
    deb = out / f"{package}_{release}-1_amd64.deb"
    return _pack(tree, deb)


def proxmox_debs(out: Path, release: str, twin_root: Path, gcc: str = GCC) -> list[Path]:
    """proxmox-kernel-<release> (:func:`kernel_deb`) and proxmox-headers-<release> whose headers
    are the twin's Debian headers re-stamped as <release> (twin/modbuild.py), so NVIDIA modules
    build against them on the twin and load into the kernel: one .config for both, as
    pve-kernel installs it into the image and the headers (its vermagic decides)."""
    from twin import modbuild

    debian = modbuild.debian_headers(twin_root)
    assert debian is not None, f"no Debian headers under {twin_root}/usr/src"
    config = re.sub(
        r'^CONFIG_CC_VERSION_TEXT=".*"$',
        f'CONFIG_CC_VERSION_TEXT="{gcc}"',
        (debian / ".config").read_text(),
        flags=re.M,
    )  # the compiler the store's key names, as a build records it in both
    image = kernel_deb(out, release, zfs=True, acs=True, gcc=gcc, proxmox=True, config=config)
    headers = out / f"stamped-headers-{release}"
    modbuild.stamp_headers(twin_root, release, headers)
    build = headers / "usr/lib/modules" / release / "build"
    build.parent.mkdir(parents=True, exist_ok=True)
    build.symlink_to(f"/usr/src/linux-headers-{release}")
    (headers / "DEBIAN").mkdir(exist_ok=True)
    _control(headers, f"proxmox-headers-{release}", release, "test kernel headers")
    headers_deb = out / f"proxmox-headers-{release}_{release}-1_amd64.deb"
    return [image, _pack(headers, headers_deb)]
