"""Boot derivation: kernel choice, command line, modules, binding, majors, refusals (IOMMU and
SEV-SNP: test_hw_iommu.py)."""

from __future__ import annotations

import itertools
import json
import os
import stat
from pathlib import Path

import pytest

from twin import boot, boot_modules, hwsim
from twin import hwtesting as ht
from twin.hwtesting import read, refresh, state, write
from twin.profile import Kernel, load_profile
from twin.pve import initramfs as pve_initramfs

KVER = "6.8.12-9-pve"
NEW = "6.14.8-2-bpo12-pve"
SKIP = ht.missing_build_tools()
needs_build = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
SKIP11 = ht.missing_build_tools(("gcc-12", "gcc-11"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> ht.ModuleCache:
    return ht.ModuleCache()


def test_systemd_boot_cmdline_only_changes_after_refresh(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    write(
        root,
        "etc/kernel/cmdline",
        "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on iommu=pt\n",
    )
    ht.boot_root(root, "kpro6")
    head = f"initrd=\\EFI\\proxmox\\{NEW}\\initrd.img-{NEW}"
    assert read(root, "proc/cmdline") == f"{head} root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet\n"
    refresh(root, cmdline="root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on")
    ht.boot_root(root, "kpro6")
    assert read(root, "proc/cmdline").endswith("quiet amd_iommu=on\n")


def test_without_snapshot_the_config_files_are_read(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    (root / boot.BOOTCFG).unlink()
    write(
        root,
        "etc/kernel/cmdline",
        "root=ZFS=rpool/ROOT/pve-1 boot=zfs pcie_acs_override=downstream\n",
    )
    ht.boot_root(root, "kpro6")
    assert read(root, "proc/cmdline").split()[1:] == [
        "root=ZFS=rpool/ROOT/pve-1",
        "boot=zfs",
        "pcie_acs_override=downstream",
    ]


def test_grub_cmdline_from_default_grub_and_grub_d(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "lumped")
    (root / boot.BOOTCFG).unlink()
    write(
        root,
        "etc/default/grub.d/iommu.cfg",
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT intel_iommu=on iommu=pt"\n',
    )
    ht.boot_root(root, "lumped")
    assert read(root, "proc/cmdline") == (
        f"BOOT_IMAGE=/boot/vmlinuz-{KVER} root=/dev/mapper/pve-root ro quiet intel_iommu=on iommu=pt\n"
    )


# -- IOMMU groups -----------------------------------------------------------------------------------
def test_newest_kernel_boots_unless_pinned(tmp_path: Path) -> None:
    # one-shots and --next-boot: test_trial_boot.py
    root = ht.make_root(tmp_path, "kpro6")
    ht.boot_root(root, "kpro6")
    assert state(root)["kernel"] == NEW
    refresh(root, kernel_default=KVER)
    ht.boot_root(root, "kpro6")
    assert state(root)["kernel"] == KVER
    assert read(root, "proc/version").startswith(
        f"Linux version {KVER} (build@proxmox) (gcc (Debian 12.2.0-14) 12.2.0,"
    )


def test_pins_from_files_without_snapshot(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    (root / boot.BOOTCFG).unlink()
    write(root, "etc/kernel/proxmox-boot-pin", KVER + "\n")
    ht.boot_root(root, "kpro6")
    assert state(root)["kernel"] == KVER
    root2 = ht.make_root(tmp_path / "grub", "lumped")
    (root2 / boot.BOOTCFG).unlink()
    hw_kernel = Kernel(version=NEW, gcc="gcc (Debian 12.2.0-14+deb12u1) 12.2.0")
    from twin.hardware import add_kernel

    add_kernel(root2, hw_kernel)
    write(
        root2,
        "etc/default/grub.d/proxmox-kernel-pin.cfg",
        f'GRUB_DEFAULT="gnulinux-advanced-1234>gnulinux-{KVER}-advanced-1234"\n',
    )
    ht.boot_root(root2, "lumped")
    assert state(root2)["kernel"] == KVER


def test_kernel_added_later_takes_its_compiler_from_its_record(tmp_path: Path) -> None:
    from twin.hardware import add_kernel

    root = ht.make_root(tmp_path, "h200x2")
    add_kernel(
        root,
        Kernel(
            version="6.17.2-1-pve",
            gcc="gcc (Debian 14.2.0-19) 14.2.0",
            ld="GNU ld (GNU Binutils for Debian) 2.44",
        ),
        headers=False,
    )
    refresh(root, kernels=[KVER, "6.17.2-1-pve"])  # proxmox-boot-tool refresh after the install
    ht.boot_root(root, "h200x2")
    assert "(gcc (Debian 14.2.0-19) 14.2.0, GNU ld (GNU Binutils for Debian) 2.44)" in read(
        root, "proc/version"
    )
    assert ht.run(root, "uname", "-r").stdout == "6.17.2-1-pve\n"


# -- modules, parameters, majors -----------------------------------------------------------------------
@needs_build
def test_options_become_module_parameters(tmp_path: Path, cache: ht.ModuleCache) -> None:
    root = ht.make_root(tmp_path, "h200x2")
    cache.install(root, KVER)
    write(root, "etc/modprobe.d/gpuhost-uvm.conf", "options nvidia_uvm uvm_disable_hmm=1 bogus=3\n")
    write(root, "etc/modules-load.d/gpuhost.conf", "nvidia\nnvidia-uvm\n")
    ht.boot_root(root, "h200x2")
    assert read(root, "sys/module/nvidia_uvm/parameters/uvm_disable_hmm") == "Y\n"
    assert read(root, "sys/module/nvidia_uvm/parameters/uvm_perf_prefetch_enable") == "1\n"
    assert "nvidia_uvm: unknown parameter 'bogus' ignored" in read(root, hwsim.DMESG)
    assert not (root / "sys/module/nvidia/parameters").exists()  # NVreg_* have mode 0
    lsmod = ht.run(root, "lsmod").stdout.splitlines()
    assert lsmod[0] == "Module                  Size  Used by"
    assert "nvidia              14299136  1 nvidia_uvm" in lsmod


@needs_build
def test_nvreg_options_show_in_proc_params(tmp_path: Path, cache: ht.ModuleCache) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    cache.install(root, NEW)
    write(
        root,
        "etc/modprobe.d/nvidia.conf",
        "options nvidia NVreg_EnableGpuFirmware=1\nblacklist nouveau\n",
    )
    ht.boot_root(root, "kpro6")
    params = read(root, "proc/driver/nvidia/params")
    assert "EnableGpuFirmware: 1\n" in params and "NvLinkDisable: 1\n" in params
    assert "nouveau" not in ht.run(root, "lsmod").stdout


@needs_build
@pytest.mark.skipif(ht.needs_root() is not None, reason=ht.needs_root() or "")
def test_uvm_majors_change_every_boot_and_nodes_follow(
    tmp_path: Path, cache: ht.ModuleCache
) -> None:
    root = ht.make_root(tmp_path, "h200x2")
    cache.install(root, KVER)
    write(root, "etc/modules-load.d/nvidia.conf", "nvidia\nnvidia_uvm\n")
    seen = []
    for _ in range(4):
        ht.boot_root(root, "h200x2")
        assert not (root / "dev/nvidia-uvm").exists()  # only nvidia-modprobe -u makes it
        assert not (root / "dev/nvidia-caps").exists()  # nor these: only nvidia-modprobe -f
        assert ht.run(root, "nvidia-modprobe", "-u", "-c=0").returncode == 0
        cap = "/proc/driver/nvidia/capabilities/mig/config"
        assert ht.run(root, "nvidia-modprobe", "-f", cap).returncode == 0
        devices = dict(
            reversed(line.split(None, 1))
            for line in read(root, "proc/devices").split("\n\n")[0].splitlines()[1:]
        )
        uvm, caps = int(devices["nvidia-uvm"]), int(devices["nvidia-caps"])
        st = (root / "dev/nvidia-uvm").stat()
        assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == uvm
        assert os.major((root / "dev/nvidia-caps/nvidia-cap1").stat().st_rdev) == caps
        assert uvm in range(234, 512) and caps in range(234, 512)
        seen.append((uvm, caps))
    assert seen[0] == (238, 241)  # the capture's majors on the first boot
    for before, after in itertools.pairwise(seen):
        assert before[0] != after[0] and before[1] != after[1]


# -- binding ------------------------------------------------------------------------------------------
def driver(root: Path, bdf: str) -> str:
    link = root / "sys/bus/pci/devices" / bdf / "driver"
    return os.readlink(link).rsplit("/", 1)[-1] if link.is_symlink() else ""


UDEV_RULE = (
    'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="0000:41:00.0", ATTR{driver_override}="vfio-pci"\n'
    'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="0000:41:00.1", ATTR{driver_override}="vfio-pci"\n'
)


@needs_build
def test_a_udev_rule_alone_loses_the_race_with_modules_load(
    tmp_path: Path, cache: ht.ModuleCache
) -> None:
    """systemd-modules-load and udev's coldplug have no ordering: the twin plays the losing
    order, so nvidia (loaded for another board) takes the board before the rule's override."""
    root = ht.make_root(tmp_path, "kpro6")
    cache.install(root, NEW)
    write(root, "etc/udev/rules.d/90-vfio.rules", UDEV_RULE)
    write(root, "etc/modules-load.d/vfio.conf", "vfio\nvfio_iommu_type1\nvfio_pci\n")
    ht.boot_root(root, "kpro6")
    assert read(root, "sys/bus/pci/devices/0000:41:00.0/driver_override") == "vfio-pci\n"
    assert driver(root, "0000:41:00.0") == "nvidia"  # the override came too late
    assert driver(root, "0000:41:00.1") == "snd_hda_intel"
    smi = ht.run(root, "nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    assert "00000000:41:00.0" in smi.stdout


@needs_build
def test_a_udev_rule_in_the_initramfs_sets_the_override_first(
    tmp_path: Path, cache: ht.ModuleCache
) -> None:
    """Debian's udev hook copies /etc/udev/rules.d rules into the initramfs, whose coldplug
    runs before the real root's modules-load: there the override is in place in time."""
    root = ht.make_root(tmp_path, "kpro6")
    cache.install(root, NEW)
    write(root, "etc/udev/rules.d/90-vfio.rules", UDEV_RULE)
    write(root, "etc/modules-load.d/vfio.conf", "vfio\nvfio_iommu_type1\nvfio_pci\n")
    kver = NEW
    record = pve_initramfs.initramfs_record(root, kver)
    assert "/usr/lib/udev/rules.d/90-vfio.rules" in record["files"]
    write(root, f"boot/initrd.img-{kver}", json.dumps(record))
    ht.boot_root(root, "kpro6")
    assert driver(root, "0000:41:00.0") == "vfio-pci"
    assert driver(root, "0000:41:00.1") == "vfio-pci"
    assert driver(root, "0000:01:00.0") == "nvidia"
    assert driver(root, "0000:01:00.1") == "snd_hda_intel"
    smi = ht.run(root, "nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader")
    assert len(smi.stdout.splitlines()) == 7 and "00000000:41:00.0" not in smi.stdout
    lspci = ht.run(root, "lspci", "-nnk", "-s", "41:00.0").stdout
    assert "Kernel driver in use: vfio-pci" in lspci


@needs_build
def test_vfio_ids_take_every_gpu_of_that_id(tmp_path: Path, cache: ht.ModuleCache) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    cache.install(root, NEW)
    # "a-vfio.conf", not "vfio.conf": kmod takes a module's first softdep line, files in name
    # order with modules.softdep among them, and nvidia.ko declares its own softdep, so a
    # vfio.conf's would never count (tests/twin/test_hw_kmod.py shows it with real kmod)
    write(
        root,
        "etc/modprobe.d/a-vfio.conf",
        "options vfio-pci ids=10de:2bb1\nsoftdep nvidia pre: vfio-pci\n",
    )
    ht.boot_root(root, "kpro6")
    gpus = [g.bdf for g in load_profile("kpro6").gpus]
    assert {driver(root, b) for b in gpus} == {"vfio-pci"}
    s = state(root)
    assert s["nvidia"]["loaded"] is False and "no GPU left" in s["nvidia"]["reason"]
    assert ht.run(root, "nvidia-smi").returncode == 9


def test_vfio_without_iommu_fails_probe(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "lumped")  # Intel without intel_iommu=on
    write(root, "etc/modprobe.d/vfio.conf", "options vfio-pci ids=10de:2bb5\n")
    write(root, "etc/modules", "vfio-pci\n")
    ht.boot_root(root, "lumped")
    assert driver(root, "0000:19:00.0") == ""
    assert "vfio-pci: probe of 0000:19:00.0 failed with error -22" in read(root, hwsim.DMESG)


@needs_build
def test_initramfs_modules_need_update_initramfs_and_refresh(
    tmp_path: Path, cache: ht.ModuleCache
) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    cache.install(root, NEW)
    write(root, "etc/modprobe.d/vfio.conf", "options vfio-pci ids=10de:2bb1\n")
    write(root, "etc/initramfs-tools/modules", "vfio_pci\n")
    ht.boot_root(root, "kpro6")
    assert state(root)["initramfs"] == "none"
    assert driver(root, "0000:01:00.0") == "nvidia"
    # update-initramfs -u: the image records the configuration as it is now
    files = {
        f"/{rel}": read(root, rel)
        for rel in ("etc/modprobe.d/vfio.conf", "etc/initramfs-tools/modules")
    }
    write(root, f"boot/initrd.img-{NEW}", json.dumps({"files": files}))
    refresh(root, initrd={})  # an ESP host boots the copy synced at the last refresh: none yet
    ht.boot_root(root, "kpro6")
    assert state(root)["initramfs"] == "missing on the ESP"
    assert driver(root, "0000:01:00.0") == "nvidia"
    refresh(root, initrd={NEW: {"files": files}})  # proxmox-boot-tool refresh
    ht.boot_root(root, "kpro6")
    assert driver(root, "0000:01:00.0") == "vfio-pci"
    write(root, "etc/modprobe.d/vfio.conf", "\n")  # edited, not regenerated: early boot keeps ids=
    ht.boot_root(root, "kpro6")
    assert driver(root, "0000:01:00.0") == "vfio-pci"


def test_the_initramfs_carries_what_initramfs_tools_copies(tmp_path: Path) -> None:
    """modprobe.d yes, modules-load.d no; with MODULES=most the USB host and i2c bus drivers
    (hook-functions auto_add_modules) but no vfio module unless a hook or the modules list adds
    it; only executable hooks count."""
    root = ht.make_root(tmp_path, "kpro6")
    write(root, "etc/modules-load.d/vfio.conf", "vfio_pci\n")
    write(root, "etc/modprobe.d/x.conf", "options vfio-pci disable_vga=1\n")
    hooks = root / "etc/initramfs-tools/hooks"
    hooks.mkdir(parents=True)
    (hooks / "vfio").write_text("#!/bin/sh\n. /usr/share/initramfs-tools/hook-functions\n")
    (hooks / "off").write_text("#!/bin/sh\nmanual_add_modules nouveau\n")  # not executable
    record = pve_initramfs.initramfs_record(root, KVER)
    assert "/etc/modprobe.d/x.conf" in record["files"]
    assert not any("modules-load.d" in f for f in record["files"])
    assert record["modules"] == [] and record["modules_policy"] == "most"
    (hooks / "vfio").write_text((hooks / "vfio").read_text() + "manual_add_modules vfio_pci\n")
    (hooks / "vfio").chmod(0o755)
    record = pve_initramfs.initramfs_record(root, KVER)
    assert record["modules"] == ["vfio_pci"]
    hw = hwsim.Hw(root)
    hw.state["kernel"] = KVER
    carried = boot_modules.carried_modules(hw, record, [])
    assert {"vfio_pci", "vfio_pci_core", "vfio", "irqbypass", "nvme"} <= carried
    assert not {"nouveau", "nvidia", "snd_hda_intel"} & carried
    write(root, "etc/initramfs-tools/conf.d/list", "MODULES=list\n")
    assert pve_initramfs.initramfs_record(root, KVER)["modules_policy"] == "list"


# -- the nvidia module refuses what a real host would not survive ---------------------------------------
@pytest.mark.skipif(SKIP11 is not None, reason=SKIP11 or "")
def test_nvidia_refuses_a_module_built_by_another_gcc(
    tmp_path: Path, cache: ht.ModuleCache
) -> None:
    root = ht.make_root(tmp_path, "h200x2")
    cache.install(root, KVER, cc="gcc-11")
    ht.boot_root(root, "h200x2")
    s = state(root)
    assert not s["nvidia"]["loaded"]
    assert s["nvidia"]["reason"] == "GCC 11.3.0 != kernel GCC 12.2.0"
    assert "refusing mismatched toolchain" in read(root, hwsim.DMESG)
    assert (
        ht.run(root, "modinfo", "-F", "vermagic", "nvidia").stdout
        == f"{KVER} SMP preempt mod_unload modversions \n"
    )
    got = ht.run(root, "modprobe", "nvidia")
    assert (
        got.returncode == 1
        and got.stderr == "modprobe: ERROR: could not insert 'nvidia': Exec format error\n"
    )
    assert ht.run(root, "nvidia-smi").returncode == 9


@needs_build
def test_nvidia_refuses_a_foreign_vermagic(tmp_path: Path, cache: ht.ModuleCache) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    ko = cache.ko("nvidia", "6.1.0-99-amd64")
    dest = root / f"lib/modules/{NEW}/updates/dkms"
    dest.mkdir(parents=True)
    (dest / "nvidia.ko").write_bytes(ko.read_bytes())
    ht.boot_root(root, "kpro6")
    assert state(root)["nvidia"]["reason"].startswith("vermagic '6.1.0-99-amd64 SMP")
    assert f"should be '{NEW} SMP preempt mod_unload modversions '" in read(root, hwsim.DMESG)


@needs_build
def test_nvidia_needs_gsp_firmware_of_its_version(tmp_path: Path, cache: ht.ModuleCache) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    cache.install(root, NEW, firmware=False)
    ht.boot_root(root, "kpro6")
    assert (
        state(root)["nvidia"]["reason"]
        == "no GSP firmware /lib/firmware/nvidia/580.159.04/gsp_*.bin"
    )
    assert ht.run(root, "nvidia-smi").returncode == 9
    (root / "lib/firmware/nvidia/580.159.04").mkdir(parents=True)
    (root / "lib/firmware/nvidia/580.159.04/gsp_ga10x.bin").write_bytes(b"fw")
    ht.boot_root(root, "kpro6")
    info = read(root, "proc/driver/nvidia/gpus/0000:01:00.0/information")
    assert "GPU Firmware: \t 580.159.04\n" in info


@needs_build
def test_blackwell_needs_the_open_module(tmp_path: Path, cache: ht.ModuleCache) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    cache.install(root, NEW, license="NVIDIA")
    ht.boot_root(root, "kpro6")
    assert "requires use of the NVIDIA open kernel modules" in read(root, hwsim.DMESG)
    assert not state(root)["nvidia"]["loaded"]


# -- quirks -----------------------------------------------------------------------------------------------
