"""Kernel image packages for tests, built with the real dpkg-deb: what `make bindeb-pkg` of a
plain tree packs (image, config, System.map, modules), and, where asked, what Proxmox's
packaging adds (zfs.ko and spl.ko in lib/modules/<release>/zfs/, the ACS patch's symbol)."""

from __future__ import annotations

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
