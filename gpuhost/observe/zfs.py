"""How the host uses ZFS, and what each installed kernel carries (gpuhost/build/features.py).

ZFS is used when / is on ZFS (the Proxmox installer's ZFS layout: root=ZFS=rpool/ROOT/pve-1),
a pool is imported, or a Proxmox storage is a `zfspool` (/etc/pve/storage.cfg). A kernel has ZFS
when depmod's modules.dep lists zfs.ko (Proxmox's package ships it in lib/modules/<release>/zfs),
and the ACS override when its System.map names Proxmox's pcie_acs_override_setup.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe


@dataclass(frozen=True)
class KernelFeatures:
    """``zfs``: zfs.ko is among the kernel's modules; ``acs_override``: the ACS patch is in
    (None: no System.map to tell)."""

    zfs: bool
    acs_override: bool | None


@dataclass(frozen=True)
class ZfsUse:
    root_fstype: str | None = None
    pools: tuple[str, ...] = ()
    zfs_storages: tuple[str, ...] = ()  # storage.cfg ids of type zfspool

    def reason(self, cmdline: Sequence[str] = ()) -> str | None:
        """How the host uses ZFS, in words; None when it does not."""
        why = []
        if self.root_fstype == "zfs" or any(p.startswith("root=ZFS=") for p in cmdline):
            why.append("its root file system is on ZFS")
        if self.pools:
            why.append(f"pools {', '.join(self.pools)} are imported")
        if self.zfs_storages:
            why.append(f"Proxmox storage {', '.join(self.zfs_storages)} is a zfspool")
        return "; ".join(why) or None


def parse_zfs_use(lines: list[str]) -> ZfsUse:
    values: dict = {"pools": (), "zfs_storages": ()}
    for line in lines:
        tag, _, rest = line.strip().partition(" ")
        if not tag:
            continue
        if tag == "rootfs" and rest:
            values["root_fstype"] = rest.strip()
        elif tag == "pool" and rest:
            values["pools"] += (rest.strip(),)
        elif tag == "zfsstorage" and rest:
            values["zfs_storages"] += (rest.strip(),)
        else:
            raise UnparsedOutput("ZFS use", line)
    return ZfsUse(**values)


class ZfsUsage(Probe[ZfsUse]):
    """
    Returns ``ZfsUse(root_fstype="zfs", pools=("rpool",), zfs_storages=("local-zfs",))``.
    """

    default = ZfsUse

    def command(self) -> str:
        return (
            "findmnt -n -o FSTYPE -T / 2>/dev/null | head -n1 | sed 's/^/rootfs /'; "
            "if command -v zpool >/dev/null 2>&1; then "
            "zpool list -H -o name 2>/dev/null | sed 's/^/pool /'; fi; "
            "[ -f /etc/pve/storage.cfg ] && "
            "sed -n 's/^zfspool:[[:space:]]*\\([^[:space:]]*\\).*/zfsstorage \\1/p' "
            "/etc/pve/storage.cfg; true"
        )

    def process(self, output: list[str]) -> ZfsUse:
        return parse_zfs_use(output)


_KERNEL = re.compile(r"^kernel (?P<release>\S+) zfs=(?P<zfs>[01]) acs=(?P<acs>[01?])$")


@dataclass(frozen=True)
class InstalledKernelFeatures:
    kernels: dict[str, KernelFeatures] = field(default_factory=dict)


def parse_kernel_features(lines: list[str]) -> InstalledKernelFeatures:
    kernels = {}
    for line in lines:
        if not line.strip():
            continue
        m = _KERNEL.match(line.strip())
        if not m:
            raise UnparsedOutput("kernel features", line)
        acs = None if m["acs"] == "?" else m["acs"] == "1"
        kernels[m["release"]] = KernelFeatures(zfs=m["zfs"] == "1", acs_override=acs)
    return InstalledKernelFeatures(kernels)


class KernelFeatureFiles(Probe[InstalledKernelFeatures]):
    """
    Returns, per directory in /lib/modules, whether modules.dep lists zfs.ko and whether
    /boot/System.map-<release> names pcie_acs_override ('?' when there is no System.map).
    """

    default = InstalledKernelFeatures

    def command(self) -> str:
        return (
            'for d in /lib/modules/*/; do [ -d "$d" ] || continue; k=${d%/}; k=${k##*/}; '
            "z=0; grep -qE '(^|/)zfs\\.ko(\\.[a-z]+)?:' \"$d/modules.dep\" 2>/dev/null && z=1; "
            'a=?; m=/boot/System.map-$k; if [ -f "$m" ]; then a=0; '
            'grep -q pcie_acs_override "$m" 2>/dev/null && a=1; fi; '
            'echo "kernel $k zfs=$z acs=$a"; done; true'
        )

    def process(self, output: list[str]) -> InstalledKernelFeatures:
        return parse_kernel_features(output)
