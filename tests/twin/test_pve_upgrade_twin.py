"""twin/upgrade.py: a kpro6 twin upgraded in place from PVE 8 to 9 the way Proxmox's "Upgrade
from 8 to 9" upgrades a host (pve-manager PVE/CLI/pve8to9.pm: the old kernels stay installed
beside proxmox-kernel-6.14; out-of-tree modules are not carried over). What the operator wrote
under /etc and the kernel pin stay; a container keeps its own Debian.
"""

from __future__ import annotations

from twin import node
from twin.upgrade import upgrade

OLD, NEW = "6.8.12-9-pve", "6.14.8-2-pve"
CMDLINE = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet iommu=pt"


def test_a_pinned_pve8_twin_upgrades_to_trixie_and_keeps_its_pin_and_etc(twin_fleet) -> None:
    (twin,) = twin_fleet.start(1, "kpro6")
    try:
        setup = (
            f"echo '{CMDLINE}' > /etc/kernel/cmdline && proxmox-boot-tool kernel pin {OLD} && "
            "echo 'options nvidia_uvm uvm_disable_hmm=1' > /etc/modprobe.d/gpuhost-nvidia.conf && "
            "mkdir -p /lib/modules/6.8.12-9-pve/updates/gpuhost && "
            "echo module > /lib/modules/6.8.12-9-pve/updates/gpuhost/nvidia.ko && "
            "printf 'arch: amd64\\nhostname: ct101\\n' > /etc/pve/lxc/101.conf && pct start 101"
        )
        rc, _, err = twin.run(setup)
        assert rc == 0, err
        assert twin.run("uname -r")[1].strip() == "6.14.8-2-bpo12-pve"  # before: the newest

        upgraded = upgrade(twin.name, "kpro6-pve9")
        assert node.Twin.load(twin.name) == upgraded and upgraded.profile == "kpro6-pve9"
        twin.reconnect()
        run = lambda cmd: twin.run(cmd)[1].strip()  # noqa: E731
        assert "VERSION_CODENAME=trixie" in run("cat /etc/os-release")
        versions = run("dpkg-query -W -f '${Package}=${Version}\\n' "
                       "pve-manager pve-container qemu-server gcc-14 kmod").split()  # fmt: skip
        assert sorted(versions) == [
            "gcc-14=14.2.0-19",
            "kmod=34.2-2",
            "pve-container=6.0.11",
            "pve-manager=9.0.10",
            "qemu-server=9.0.21",
        ]
        assert twin.run("dpkg-query -W gcc-12")[0] == 1  # bookworm's compiler is gone
        rc, out, err = twin.run("apt-get check -q")  # the merged dpkg database is consistent
        assert rc == 0, out + err
        # the twin's diverted tools: trixie's real binary behind the wrapper
        assert run("/usr/bin/uname.distrib -r") != ""
        # /etc kept; the new kernel beside the old ones; the pin kept, so the old one boots
        assert run("cat /etc/kernel/cmdline") == CMDLINE
        assert "uvm_disable_hmm=1" in run("cat /etc/modprobe.d/gpuhost-nvidia.conf")
        assert run("cat /etc/kernel/proxmox-boot-pin") == OLD
        assert run("uname -r") == OLD
        assert run(f"ls /boot/vmlinuz-{NEW} /boot/initrd.img-{NEW}").split() == [
            f"/boot/initrd.img-{NEW}",
            f"/boot/vmlinuz-{NEW}",
        ]
        assert NEW in run("proxmox-boot-tool kernel list")
        assert "gcc (Debian 14.2.0-19) 14.2.0" in run(f"cat /boot/config-{NEW}")
        assert (
            run("find /lib/modules -name nvidia.ko")
            == f"/lib/modules/{OLD}/updates/gpuhost/nvidia.ko"
        )
        # the container was stopped by the reboot; started again it is still Debian 12
        assert twin.run("pct start 101")[0] == 0
        assert "VERSION_CODENAME=bookworm" in run("pct exec 101 -- cat /etc/os-release")
        twin.run("pct stop 101")
    finally:
        twin_fleet.stop(twin)
