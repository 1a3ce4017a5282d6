"""The twin's initramfs holds what Debian 13's real initramfs-tools puts in one: the same
modules with MODULES=most and gpuhost's vfio hook, /etc/modprobe.d but not modules-load.d.

Real mkinitramfs (initramfs-tools 0.148, trixie: PVE 9's) runs chrooted into an overlay of the
twin's trixie base over a module tree of real .ko files, one per module the twin's catalog
places (hwsim MODULE_DIRS), and gpuhost's own files; lsinitramfs lists the image. The twin
answers the same question from the same files (twin/pve/initramfs.py, twin/boot_modules.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuhost.plan.guests.vfio import INITRAMFS_HOOK, MODPROBE_CONF, VfioBinding, modprobe_conf
from twin import boot_modules
from twin import hwtesting as ht
from twin.hwsim.catalog import MODULE_DIRS
from twin.pve.initramfs import hook_modules, initramfs_record

KVER = "6.8.12-9-pve"
HOOK = Path(__file__).parents[2] / "files/gpuhost-vfio-initramfs-hook"
# initramfs-tools' hook-functions picks block drivers by the symbols they use (auto_add_modules
# "block": blockfuncs ... nvme_init_ctrl); a real nvme.ko uses nvme_init_ctrl, the stand-in
# uses nothing, so only the twin (which counts the directory) carries it.
BY_SYMBOL = {"nvme"}
SKIP = ht.missing_build_tools() or ht.needs_root()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def real_image(base: Path, tmp: Path, upper: Path) -> list[str]:
    """lsinitramfs of the image real mkinitramfs makes in an overlay of base with upper on top."""
    (tmp / "work").mkdir()
    (tmp / "merged").mkdir()
    inside = (
        f"depmod {KVER} && mkinitramfs -o /tmp/initrd.img {KVER} && lsinitramfs /tmp/initrd.img"
    )
    script = (
        f"mount -t overlay overlay -o lowerdir={base},upperdir={upper},workdir={tmp / 'work'} "
        f"{tmp / 'merged'} && exec chroot {tmp / 'merged'} "
        f"env PATH=/usr/sbin:/usr/bin:/sbin:/bin sh -c '{inside}'"
    )
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_trixie_initramfs_carries_what_the_twin_says(tmp_path: Path, trixie_base: Path) -> None:
    base = trixie_base
    cache = ht.ModuleCache()
    upper = tmp_path / "upper"
    for name, directory in MODULE_DIRS.items():
        dest = upper / "usr/lib/modules" / KVER / directory / f"{name.replace('_', '-')}.ko"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(cache.ko(name, KVER, softdep=""), dest)
    ht.write(upper, MODPROBE_CONF.lstrip("/"), modprobe_conf(VfioBinding(("0000:c1:00.0",), ())))
    ht.write(upper, INITRAMFS_HOOK.lstrip("/"), HOOK.read_text())
    (upper / INITRAMFS_HOOK.lstrip("/")).chmod(0o755)
    ht.write(upper, "etc/modules-load.d/gpuhost-nvidia.conf", "nvidia\n")

    listing = real_image(base, tmp_path, upper)
    real = {
        Path(p).name.removesuffix(".ko").replace("-", "_")
        for p in listing
        if p.startswith(f"usr/lib/modules/{KVER}/") and p.endswith(".ko")
    }
    twin = {m for m in MODULE_DIRS if boot_modules._most_carries(m)} | set(hook_modules(upper))
    assert real == twin - BY_SYMBOL
    assert "vfio_pci" in real and not real & {"nouveau", "vfio_iommu_type1", "kvm", "ast"}

    files = set(initramfs_record(upper, KVER)["files"])  # type: ignore[arg-type]
    assert MODPROBE_CONF.lstrip("/") in listing and MODPROBE_CONF in files
    assert not any(p.startswith("etc/modules-load.d") for p in listing)
    assert not any(f.startswith("/etc/modules-load.d") for f in files)
