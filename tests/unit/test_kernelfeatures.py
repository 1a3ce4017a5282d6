"""What a kernel carries from Proxmox's packaging, read from its package (real dpkg-deb builds)
or the host's files, and the refusals that follow (gpuhost.build.features, gpuhost/observe/zfs.py)."""

from __future__ import annotations

import pytest

from gpuhost.build.debinfo import DebError
from gpuhost.build.features import feature_problems, package_features
from gpuhost.observe.zfs import KernelFeatures, parse_kernel_features, parse_zfs_use
from tests.kerneldebs import kernel_deb

REL = "6.14.8-2-bpo12-pve"


@pytest.mark.parametrize("usr_merged", [False, True])
def test_a_proxmox_packaged_kernel_has_zfs_and_the_acs_patch(tmp_path, usr_merged):
    deb = kernel_deb(tmp_path, REL, zfs=True, acs=True, usr_merged=usr_merged)
    assert package_features(deb, REL) == KernelFeatures(zfs=True, acs_override=True)


def test_a_bindeb_pkg_kernel_has_neither(tmp_path):
    deb = kernel_deb(tmp_path, REL, zfs=False, acs=False)
    assert package_features(deb, REL) == KernelFeatures(zfs=False, acs_override=False)
    # another release's zfs.ko does not count
    other = kernel_deb(tmp_path, "6.8.12-9-pve", zfs=True, acs=True)
    assert package_features(other, REL) == KernelFeatures(zfs=False, acs_override=None)


def test_not_a_package_is_refused_naming_it(tmp_path):
    junk = tmp_path / "linux-image-x.deb"
    junk.write_bytes(b"not an archive")
    with pytest.raises(DebError, match=r"linux-image-x\.deb"):
        package_features(junk, REL)


def test_refusals_name_the_need_and_the_fix():
    plain = KernelFeatures(zfs=False, acs_override=False)
    root = "its root file system is on ZFS"
    (zfs,) = feature_problems(REL, plain, root, None, "the package")
    assert "has no zfs.ko (the package)" in zfs and "mount its root" in zfs
    assert "proxmox/pve-kernel" in zfs and "kernel.source: package" in zfs
    (acs,) = feature_problems(REL, plain, None, "downstream", "the package")
    assert "boot.acs_override is 'downstream'" in acs and "lacks Proxmox's" in acs
    assert feature_problems(REL, plain, None, None, "x") == []
    full = KernelFeatures(zfs=True, acs_override=True)
    assert feature_problems(REL, full, root, "downstream", "x") == []
    unknown = KernelFeatures(zfs=True, acs_override=None)
    assert "has no System.map" in feature_problems(REL, unknown, None, "downstream", "x")[0]


def test_zfs_use_from_the_host():
    use = parse_zfs_use(["rootfs zfs", "pool rpool", "pool tank", "zfsstorage local-zfs"])
    assert use.pools == ("rpool", "tank") and use.zfs_storages == ("local-zfs",)
    assert use.reason() == (
        "its root file system is on ZFS; pools rpool, tank are imported; "
        "Proxmox storage local-zfs is a zfspool"
    )
    assert parse_zfs_use(["rootfs ext4"]).reason() is None
    assert parse_zfs_use([]).reason(["root=ZFS=rpool/ROOT/pve-1"]) is not None


def test_kernel_features_on_the_host():
    parsed = parse_kernel_features(
        [
            "kernel 6.8.12-9-pve zfs=1 acs=1",
            "kernel 6.1.158-1-pve zfs=0 acs=0",
            "kernel x zfs=0 acs=?",
        ]
    )
    assert parsed.kernels["6.8.12-9-pve"] == KernelFeatures(True, True)
    assert parsed.kernels["6.1.158-1-pve"] == KernelFeatures(False, False)
    assert parsed.kernels["x"].acs_override is None
