"""The twin's disks as a trial boot sees them: ESP file trees written by refresh and shown by
mount, findmnt's layout per install, vermagic from a real kernel's .config. (A boot that panics
on GSP firmware of another release is tests/e2e/test_trial_deploy.py's, over SSH.)"""

from __future__ import annotations

from pathlib import Path

from twin import hwtesting as ht
from twin import pve
from twin.hwsim.machine import config_vermagic
from twin.hwtesting import write
from twin.profile import Boot, load_profile
from twin.pve import cli

OLD, NEW = "6.8.12-9-pve", "6.14.8-2-bpo12-pve"
UUID = "9B1C-4F2A"  # kpro6's ESP
GCC = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"


def test_refresh_writes_the_esp_as_proxmox_boot_tool_does(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    pve.install(root, load_profile("kpro6"))  # proxmox-boot-tool's kernel hooks
    for kver in (OLD, NEW):
        (root / f"boot/initrd.img-{kver}").write_text(f"initrd {kver}\n")
    write(root, "etc/kernel/proxmox-boot-pin", f"{OLD}\n")
    assert cli.run("proxmox-boot-tool", ["refresh"], root)[0] == 0
    esp = root / "var/lib/gpuhost-twin/esp" / UUID
    assert (esp / "loader/loader.conf").read_text() == f"timeout 3\ndefault proxmox-{OLD}.conf\n"
    entry = (esp / f"loader/entries/proxmox-{NEW}.conf").read_text()
    assert f"linux    /EFI/proxmox/{NEW}/vmlinuz-{NEW}\n" in entry
    assert "options   root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet" in entry
    assert (esp / f"EFI/proxmox/{NEW}/initrd.img-{NEW}").read_text() == f"initrd {NEW}\n"
    (root / f"boot/initrd.img-{NEW}").unlink()  # no initrd: not synced, and removed from the ESP
    assert cli.run("proxmox-boot-tool", ["refresh"], root)[0] == 0
    assert not (esp / f"loader/entries/proxmox-{NEW}.conf").exists()
    assert not (esp / f"EFI/proxmox/{NEW}").exists()


def test_mount_shows_the_esp_and_umount_leaves_the_mount_point(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    # inside the twin the path is /var/lib/gpuhost-twin/esp/...; here TWIN_ROOT is the root
    res = ht.run(root, "mount", "-t", "vfat", f"/dev/disk/by-uuid/{UUID}", str(mnt))
    assert res.returncode == 0, res.stderr
    assert mnt.is_symlink() and str(mnt.readlink()).endswith(f"esp/{UUID}")
    assert ht.run(root, "umount", str(mnt)).returncode == 0
    assert mnt.is_dir() and not mnt.is_symlink() and not any(mnt.iterdir())


def test_findmnt_gives_the_install_layout(tmp_path: Path) -> None:
    zfs = ht.make_root(tmp_path / "zfs", "kpro6")
    res = ht.run(zfs, "findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", "/boot/grub")
    assert res.stdout.split() == ["rpool/ROOT/pve-1", "zfs"]
    lvm = load_profile("kpro6").model_copy(
        update={"boot": Boot(firmware="bios", loader="grub", default_grub="GRUB_DEFAULT=0\n")}
    )
    res = ht.run(
        ht.make_root(tmp_path / "lvm", lvm), "findmnt", "-n", "-o", "SOURCE,FSTYPE", "-T", "/"
    )
    assert res.stdout.split() == ["/dev/mapper/pve-root", "ext4"]


def test_vermagic_follows_the_kernel_config() -> None:
    tiny = "CONFIG_64BIT=y\nCONFIG_MODULES=y\nCONFIG_MODULE_UNLOAD=y\n# CONFIG_SMP is not set\n"
    assert config_vermagic("6.1.192-1-pve", tiny) == "6.1.192-1-pve mod_unload"
    pve = "CONFIG_SMP=y\nCONFIG_PREEMPT_BUILD=y\nCONFIG_MODULE_UNLOAD=y\nCONFIG_MODVERSIONS=y\n"
    assert config_vermagic("6.8.12-9-pve", pve) == "6.8.12-9-pve SMP preempt mod_unload modversions"
    # A PREEMPT_DYNAMIC kernel (Debian's, Proxmox's) has CONFIG_PREEMPT unset and still says
    # "preempt": vermagic.h keys on CONFIG_PREEMPT_BUILD. Debian's real config shows it.
    headers = sorted(Path("/usr/src").glob("linux-headers-*-amd64"))
    if headers:
        config = (headers[-1] / ".config").read_text()
        assert "# CONFIG_PREEMPT is not set" in config
        assert config_vermagic("6.1.0-57-amd64", config) == (
            "6.1.0-57-amd64 SMP preempt mod_unload modversions"
        )
