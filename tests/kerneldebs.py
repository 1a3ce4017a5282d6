"""Kernel image packages for tests, built with the real dpkg-deb: what `make bindeb-pkg` of a
plain tree packs (image, config, System.map, modules), and, where asked, what Proxmox's
packaging adds (zfs.ko and spl.ko in lib/modules/<release>/zfs/, the ACS patch's symbol)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

GCC = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"


def kernel_deb(
    out: Path, release: str, zfs: bool, acs: bool, usr_merged: bool = False, gcc: str = GCC
) -> Path:
    """A linux-image-<release> .deb in ``out``; ``usr_merged``: modules under usr/lib as
    pve-kernel's trixie packaging puts them."""
    tree = out / f"tree-{release}-{int(zfs)}{int(acs)}"
    mods = tree / ("usr/lib" if usr_merged else "lib") / "modules" / release
    (tree / "DEBIAN").mkdir(parents=True, exist_ok=True)
    (tree / "boot").mkdir(exist_ok=True)
    (tree / "DEBIAN/control").write_text(
        f"Package: linux-image-{release}\nVersion: {release}-1\nArchitecture: amd64\n"
        "Maintainer: gpuhost tests <root@localhost>\nDescription: test kernel\n"
    )
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
    deb = out / f"linux-image-{release}_{release}-1_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(tree), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def proxmox_debs(out: Path, release: str, twin_root: Path, gcc: str = GCC) -> list[Path]:
    """proxmox-kernel-<release> and proxmox-headers-<release> as pve-kernel's debian/rules lays
    them out (modules under usr/lib with zfs/zfs.ko and spl.ko, depmod's index built at package
    time, System.map with the ACS patch's setup function); the headers are the twin's Debian
    headers re-stamped as <release> (twin/modbuild.py), so the NVIDIA modules build against them
    on the twin."""
    from twin import modbuild

    image = kernel_deb(out, release, zfs=True, acs=True, usr_merged=True, gcc=gcc)
    tree = out / f"tree-{release}-11"
    # One .config for the image and its headers, as pve-kernel installs it into both.
    debian = modbuild.debian_headers(twin_root)
    assert debian is not None, f"no Debian headers under {twin_root}/usr/src"
    config = re.sub(
        r'^CONFIG_CC_VERSION_TEXT=".*"$',
        f'CONFIG_CC_VERSION_TEXT="{gcc}"',
        (debian / ".config").read_text(),
        flags=re.M,
    )  # the compiler the store's key names, as a build records it in both
    (tree / "boot" / f"config-{release}").write_text(config)
    mods = tree / "usr/lib/modules" / release
    (mods / "modules.dep").write_text(
        "kernel/drivers/block/loop.ko:\nzfs/zfs.ko: zfs/spl.ko\nzfs/spl.ko:\n"
    )
    control = (tree / "DEBIAN/control").read_text()
    (tree / "DEBIAN/control").write_text(
        control.replace(f"linux-image-{release}", f"proxmox-kernel-{release}")
    )
    # pve-kernel's postinst runs depmod and then the kernel hooks (initramfs-tools builds the
    # initramfs, zz-proxmox-boot syncs the ESPs): debian/proxmox-kernel.postinst.in. The index
    # is shipped built here (the stand-in .ko files are not ELF objects depmod could read).
    postinst = tree / "DEBIAN/postinst"
    postinst.write_text(
        '#!/bin/sh\nset -e\n[ "$1" = configure ] || exit 0\n'
        f"run-parts --verbose --exit-on-error --arg={release} --arg=/boot/vmlinuz-{release} "
        "/etc/kernel/postinst.d\n"
    )
    postinst.chmod(0o755)
    image.unlink()
    image = out / f"proxmox-kernel-{release}_{release}-1_amd64.deb"
    headers = out / f"headers-{release}"
    modbuild.stamp_headers(twin_root, release, headers)
    (headers / "usr/lib/modules" / release).mkdir(parents=True, exist_ok=True)
    (headers / "usr/lib/modules" / release / "build").symlink_to(
        f"/usr/src/linux-headers-{release}"
    )
    (headers / "DEBIAN").mkdir(exist_ok=True)
    (headers / "DEBIAN/control").write_text(
        f"Package: proxmox-headers-{release}\nVersion: {release}-1\nArchitecture: amd64\n"
        "Maintainer: gpuhost tests <root@localhost>\nDescription: test kernel headers\n"
    )
    headers_deb = out / f"proxmox-headers-{release}_{release}-1_amd64.deb"
    for src, deb in ((tree, image), (headers, headers_deb)):
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(src), str(deb)],
            check=True,
            capture_output=True,
        )
    return [image, headers_deb]
