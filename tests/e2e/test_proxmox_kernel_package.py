"""A Proxmox-packaged kernel from the store installs on a kpro6 twin with the twin's real dpkg:
the store entry gpuhost's pve-kernel build keeps (proxmox-kernel-<release> and
proxmox-headers-<release>, made here by tests/kerneldebs.py as that build names and lays them
out) is planned image first (gpuhost/kernelstore.py), passes the ZFS-root check
(gpuhost/kernelfeatures.py), and `dpkg -i` in that order runs its maintainer script: depmod and
the /etc/kernel/postinst.d hooks (initramfs, proxmox-boot-tool's ESP sync), as pve-kernel's
debian/proxmox-kernel.postinst.in does."""

from __future__ import annotations

import shutil

from gpuhost.artifacts import ArtifactKey, ArtifactStore
from gpuhost.kernelfeatures import feature_problems, package_features
from gpuhost.kernelstore import plan_install
from tests.e2e.reprovision import GCC, fresh_kpro6
from tests.kerneldebs import headers_deb, kernel_deb

RELEASE = "6.14.8-2-bpo12-pve"


def test_a_stored_proxmox_kernel_installs_with_its_hooks_on_a_zfs_root(fresh, tmp_path):
    twin = fresh(fresh_kpro6(tmp_path))
    assert twin.run("findmnt -n -o FSTYPE -T /")[1].strip() == "zfs"
    store = ArtifactStore(tmp_path / "store")
    debs = [
        headers_deb(tmp_path, RELEASE, proxmox=True),
        kernel_deb(tmp_path, RELEASE, zfs=True, acs=True, proxmox=True),
    ]
    store.put(ArtifactKey("kernel", RELEASE, RELEASE, GCC, "pve"), debs)
    install = plan_install(RELEASE, "build", "12.2.0", store)
    image = install.debs[0]
    assert feature_problems(RELEASE, package_features(image, RELEASE), "root", None, "x") == []
    (twin.root / "root/debs").mkdir(parents=True, exist_ok=True)
    for deb in install.debs:
        shutil.copy(deb, twin.root / "root/debs")
    names = " ".join(f"/root/debs/{deb.rsplit('/', 1)[-1]}" for deb in install.debs)
    rc, out, err = twin.run(f"dpkg -i {names}")
    assert rc == 0, out + err
    assert out.index(f"Setting up proxmox-kernel-{RELEASE}") < out.index(
        "Setting up proxmox-headers-"
    )
    assert "update-initramfs: Generating /boot/initrd.img-" + RELEASE in out + err
    assert (twin.root / f"boot/initrd.img-{RELEASE}").exists()
    rc, status, _ = twin.run(f"dpkg-query -W -f '${{Status}}' proxmox-kernel-{RELEASE}")
    assert (rc, status) == (0, "install ok installed")
    # usr/lib/modules in the package is /lib/modules on the usr-merged root; depmod indexed it
    deps = twin.run(f"cat /lib/modules/{RELEASE}/modules.dep")[1]
    assert "zfs/zfs.ko:" in deps and "zfs/spl.ko:" in deps
