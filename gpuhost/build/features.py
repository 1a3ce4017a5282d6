"""What a kernel must carry for this host, read from its package or its installed files.

Proxmox's kernel packaging adds two things a plain `make bindeb-pkg` of a tree does not have:
- zfs.ko and spl.ko, built from the zfsonlinux submodule and installed into
  lib/modules/<release>/zfs/, then indexed by depmod (proxmox/pve-kernel debian/rules,
  bookworm-6.14 L177-179, L206). A host whose root is on ZFS cannot import its root pool from
  the initramfs without them (the boot stops there); pools and zfspool storages stay offline.
- the `pcie_acs_override` option, from patches/kernel/0004-pci-Enable-overrides-for-missing-
  ACS-capabilities: an early_param with no Kconfig symbol, whose setup function
  `pcie_acs_override_setup` is in the kernel's System.map (vmlinuz is compressed, the config
  says nothing). A kernel without it ignores the parameter: IOMMU groups stay lumped.
So before a kernel is installed its package is read (on the control machine), and an installed
one is read from the host (gpuhost/observe/zfs.py); one that lacks what the host needs is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuhost.build.debinfo import DebError, data_tar
from gpuhost.observe.zfs import KernelFeatures

ACS_SYMBOL = b"pcie_acs_override"
_ZFS_KO = r"(?:usr/)?lib/modules/{release}/.+/zfs\.ko(?:\.xz|\.zst|\.gz)?"


def package_features(deb: str | Path, release: str) -> KernelFeatures:
    """Read a kernel image package (linux-image-* or proxmox-kernel-*) without installing it."""
    zfs_ko = re.compile(_ZFS_KO.format(release=re.escape(release)))
    system_map = f"boot/System.map-{release}"
    zfs, acs = False, None
    try:
        with data_tar(Path(deb)) as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if zfs_ko.fullmatch(name):
                    zfs = True
                elif name == system_map and member.isfile():
                    extracted = tar.extractfile(member)
                    acs = ACS_SYMBOL in (extracted.read() if extracted else b"")
    except (OSError, EOFError) as exc:
        raise DebError(f"{deb}: cannot be read: {exc}") from None
    return KernelFeatures(zfs=zfs, acs_override=acs)


def feature_problems(
    release: str,
    features: KernelFeatures,
    zfs_use: str | None,
    acs_override: str | None,
    where: str,
) -> list[str]:
    """Why ``release`` (read from ``where``) must not be installed or booted on this host.

    ``zfs_use``: how the host uses ZFS (None: it does not); ``acs_override``: boot.acs_override.
    """
    fix = (
        "build it the Proxmox way (proxmox/pve-kernel's packaging, with its zfsonlinux "
        "submodule and patches), or install Proxmox's proxmox-kernel package (kernel.source: "
        "package)"
    )
    problems = []
    if zfs_use and not features.zfs:
        problems.append(
            f"kernel {release} has no zfs.ko ({where}), but this host uses ZFS ({zfs_use}): "
            f"it could not import its pools{' or mount its root' if 'root' in zfs_use else ''}. "
            f"Refused before it is installed; {fix}"
        )
    if acs_override and not features.acs_override:
        problems.append(
            f"boot.acs_override is {acs_override!r}, but kernel {release} "
            f"{'has no System.map to show' if features.acs_override is None else 'lacks'} "
            f"Proxmox's pcie_acs_override patch ({where}): it would ignore the parameter and "
            f"the IOMMU groups would stay as they are. {fix[0].upper()}{fix[1:]}, or drop "
            "boot.acs_override"
        )
    return problems
