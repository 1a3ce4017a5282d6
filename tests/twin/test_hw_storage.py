"""What a kernel needs from Proxmox's packaging on the twin (twin/hwsim/storage.py): a ZFS root
needs zfs.ko in the booted kernel, pcie_acs_override needs Proxmox's ACS patch; and the pools and
Proxmox storages that `zpool status -x` and `pvesm status` report."""

from __future__ import annotations

from pathlib import Path

import pytest

from twin import hwsim
from twin import hwtesting as ht
from twin.hardware import add_kernel
from twin.hwtesting import read, refresh, state
from twin.kernel_choice import BrickedError
from twin.profile import Boot, Kernel, ZfsPool, load_profile

OLD = "6.8.12-9-pve"
PLAIN = "6.1.158-1-pve"  # a `make bindeb-pkg` kernel: no zfs.ko, no ACS patch
GCC = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"
ZFS_ROOT = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet"


def plain_kernel(root: Path) -> None:
    add_kernel(root, Kernel(version=PLAIN, gcc=GCC, zfs=False, acs_override=False), headers=False)


def test_a_kernel_without_zfs_ko_cannot_boot_a_zfs_root_and_the_trial_falls_back(
    tmp_path: Path,
) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    plain_kernel(root)
    # The trial: the old kernel is the loader's default, the plain one the one-shot, panic=10.
    refresh(root, kernel_default=OLD, cmdline=f"{ZFS_ROOT} panic=10", kernels=[OLD, PLAIN])
    ht.boot_root(root, "kpro6")
    assert state(root)["kernel"] == OLD
    assert hwsim.storage.kernel_has_zfs(root, OLD)
    assert ht.run(root, "bootctl", "set-oneshot", f"proxmox-{PLAIN}.conf").returncode == 0
    ht.boot_root(root, "kpro6")
    assert state(root)["kernel"] == OLD  # came back by itself
    attempts = state(root)["boot_attempts"]
    assert attempts[0] == {"kernel": PLAIN, "result": "panicked; rebooted (panic=10)"}
    log = ht.run(root, "journalctl", "-b", "-1", "-k").stdout
    assert "Failed to load ZFS modules." in log
    # Without panic=N the initramfs waits at its prompt: the host does not come back.
    refresh(root, kernel_default=PLAIN, cmdline=ZFS_ROOT)
    with pytest.raises(BrickedError):
        ht.boot_root(root, "kpro6")


def test_a_plain_kernel_boots_a_btrfs_root(tmp_path: Path) -> None:
    prof = load_profile("kpro6")
    btrfs = prof.boot.model_copy(update={"root_fs": "btrfs", "kernel_cmdline": "root=/dev/sda3"})
    prof = prof.model_copy(update={"boot": btrfs})
    root = ht.make_root(tmp_path, prof)
    plain_kernel(root)
    refresh(root, kernel_default=PLAIN, cmdline="root=/dev/sda3 ro quiet", kernels=[OLD, PLAIN])
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == PLAIN
    assert ht.run(root, "findmnt", "-n", "-o", "FSTYPE", "-T", "/").stdout.strip() == "btrfs"
    assert "btrfs: local-btrfs" in read(root, "etc/pve/storage.cfg")


def groups(root: Path) -> dict[int, list[str]]:
    base = root / "sys/kernel/iommu_groups"
    return {int(g.name): sorted(d.name for d in (g / "devices").iterdir()) for g in base.iterdir()}


def test_pcie_acs_override_does_nothing_without_the_proxmox_patch(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "lumped")
    plain_kernel(root)
    cmdline = (
        "root=/dev/mapper/pve-root ro intel_iommu=on pcie_acs_override=downstream,multifunction"
    )
    refresh(root, cmdline=cmdline, kernel_default=OLD, kernels=[OLD, PLAIN])
    ht.boot_root(root, "lumped")
    assert groups(root)[24] == ["0000:19:00.0"]  # Proxmox's kernel: split
    refresh(root, cmdline=cmdline, kernel_default=PLAIN)
    ht.boot_root(root, "lumped")
    assert state(root)["kernel"] == PLAIN
    assert 24 not in groups(root)
    assert "0000:19:00.0" in groups(root)[21]  # still lumped with the switch ports
    log = read(root, hwsim.DMESG)
    assert "PCIe ACS overrides enabled" not in log
    assert 'Unknown kernel command line parameters "pcie_acs_override=' in log


def test_zpool_and_pvesm_report_the_pools_and_storages(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    ht.boot_root(root, "kpro6")
    res = ht.run(root, "zpool", "status", "-x")
    assert (res.returncode, res.stdout) == (0, "all pools are healthy\n")
    assert ht.run(root, "zpool", "list", "-H", "-o", "name,health").stdout == "rpool\tONLINE\n"
    lines = ht.run(root, "pvesm", "status").stdout.splitlines()
    assert lines[0].split() == ["Name", "Type", "Status", "Total", "(KiB)", "Used", "(KiB)",
                                "Available", "(KiB)", "%"]  # fmt: skip
    assert [line.split()[:3] for line in lines[1:]] == [
        ["local", "dir", "active"],
        ["local-zfs", "zfspool", "active"],
    ]
    # A degraded data pool, and a GRUB host whose storage pool needs zfs.ko from the kernel.
    prof = load_profile("lumped")
    prof = prof.model_copy(
        update={"zfs_pools": [ZfsPool(name="tank", state="DEGRADED"), ZfsPool(name="fast")]}
    )
    root = ht.make_root(tmp_path / "lumped", prof)
    ht.write(root, "etc/pve/storage.cfg", "zfspool: vmdata\n\tpool fast/vm\n\tcontent images\n")
    ht.boot_root(root, prof)
    out = ht.run(root, "zpool", "status", "-x").stdout
    assert "  pool: tank\n state: DEGRADED\n" in out and "pool: fast" not in out
    plain_kernel(root)
    refresh(root, kernel_default=PLAIN, kernels=[OLD, PLAIN])
    ht.boot_root(root, prof)
    res = ht.run(root, "zpool", "status", "-x")
    assert res.returncode == 1 and "The ZFS modules are not loaded." in res.stderr
    res = ht.run(root, "pvesm", "status")
    assert res.stdout.splitlines()[1].split()[:3] == ["vmdata", "zfspool", "inactive"]
    assert "zfs error: cannot open 'fast': no such pool" in res.stderr


def test_profile_root_fs_is_checked() -> None:
    with pytest.raises(ValueError):
        Boot(firmware="uefi", loader="systemd-boot", kernel_cmdline=ZFS_ROOT, root_fs="xfs")
