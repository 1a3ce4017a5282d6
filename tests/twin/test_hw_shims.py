"""The hardware shims at run time: lspci, uname, kmod tools, nvidia-modprobe, dmesg, sysfs writes."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from twin import hardware, hwsim
from twin import hwtesting as ht
from twin.profile import load_profile

as_root = pytest.mark.skipif(ht.needs_root() is not None, reason=ht.needs_root() or "")

KVER = "6.8.12-9-pve"
NEW = "6.14.8-2-bpo12-pve"
SKIP = ht.missing_build_tools()
needs_build = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


@pytest.fixture(scope="module")
def kpro6(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = ht.make_root(tmp_path_factory.mktemp("kpro6"), "kpro6")
    if SKIP is None:
        ht.ModuleCache().install(root, NEW)
    (root / "etc/modules-load.d").mkdir(parents=True)
    (root / "etc/modules-load.d/vfio.conf").write_text("vfio_pci\n")
    ht.boot_root(root, "kpro6")
    return root


def test_lspci_format(kpro6: Path) -> None:
    got = ht.run(kpro6, "lspci", "-D", "-nn", "-k", "-s", "0000:01:00.1").stdout
    assert got == (
        "0000:01:00.1 Audio device [0403]: NVIDIA Corporation Device 22e8 [10de:22e8] (rev a1)\n"
        "\tSubsystem: NVIDIA Corporation Device 204b [10de:204b]\n"
        "\tKernel driver in use: snd_hda_intel\n"
        "\tKernel modules: snd_hda_intel\n"
    )
    short = ht.run(kpro6, "lspci", "-s", "01:00.0").stdout
    assert short == "01:00.0 VGA compatible controller: NVIDIA Corporation Device 2bb1 (rev a1)\n"


def test_lspci_vv_shows_acs_on_root_ports(kpro6: Path) -> None:
    got = ht.run(kpro6, "lspci", "-D", "-nn", "-vv", "-s", "0000:00:01.1").stdout
    assert "\tCapabilities: [2a0 v1] Access Control Services\n" in got
    assert (
        "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+\n"
        in got
    )
    assert "\tIOMMU group: 11\n\tCapabilities" in got
    assert "\tKernel driver in use: pcieport\n" in got
    gpu = ht.run(kpro6, "lspci", "-vv", "-s", "01:00.0").stdout
    assert "Access Control Services" not in gpu and "\tNUMA node: 0\n" in gpu


def test_lspci_uses_the_roots_pci_ids(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "h200x2")
    ht.boot_root(root, "h200x2")
    ids = root / "usr/share/misc/pci.ids"
    ids.parent.mkdir(parents=True)
    ids.write_text("10de  NVIDIA Corporation\n\t2335  GH100 [H200 SXM 141GB]\n")
    got = ht.run(root, "lspci", "-nn", "-s", "00:06.0").stdout
    assert (
        got
        == "00:06.0 3D controller [0302]: NVIDIA Corporation GH100 [H200 SXM 141GB] [10de:2335] (rev a1)\n"
    )


def test_uname_is_the_simulated_kernel(kpro6: Path) -> None:
    assert ht.run(kpro6, "uname", "-r").stdout == f"{NEW}\n"
    assert ht.run(kpro6, "uname", "-m").stdout == "x86_64\n"
    assert ht.run(kpro6, "uname", "-sr").stdout == f"Linux {NEW}\n"
    assert ht.run(kpro6, "uname", "-a").stdout == (
        f"Linux kpro6 {NEW} #1 SMP PREEMPT_DYNAMIC PMX 6.14.8-2~bpo12+1 (2025-07-22T10:04Z) x86_64 GNU/Linux\n"
    )
    assert ht.run(kpro6, "uname", "-x").returncode == 1


@needs_build
def test_modinfo_resolves_names_against_the_simulated_kernel(kpro6: Path) -> None:
    got = ht.run(kpro6, "modinfo", "nvidia")
    assert got.returncode == 0, got.stderr
    assert f"filename:       /lib/modules/{NEW}/updates/dkms/nvidia.ko\n" in got.stdout
    assert "version:        580.159.04\n" in got.stdout
    assert ht.run(kpro6, "modinfo", "-F", "version", "nvidia").stdout == "580.159.04\n"
    assert (
        ht.run(kpro6, "modinfo", "-k", KVER, "nvidia").stderr
        == "modinfo: ERROR: Module nvidia not found.\n"
    )
    intree = ht.run(kpro6, "modinfo", "-F", "filename", "vfio-pci").stdout
    assert intree == f"/lib/modules/{NEW}/kernel/drivers/vfio/pci/vfio-pci.ko\n"


@needs_build
def test_modprobe_remove_and_reload(kpro6: Path) -> None:
    assert ht.run(kpro6, "modprobe", "nvidia_uvm").returncode == 0
    busy = ht.run(kpro6, "modprobe", "-r", "nvidia")
    assert (busy.returncode, busy.stderr) == (1, "modprobe: FATAL: Module nvidia is in use.\n")
    assert ht.run(kpro6, "modprobe", "-r", "nvidia_uvm").returncode == 0
    assert ht.run(kpro6, "modprobe", "-r", "nvidia").returncode == 0
    assert ht.run(kpro6, "nvidia-smi", "-L").returncode == 9
    assert not (kpro6 / "dev/nvidia0").exists()
    assert ht.run(kpro6, "modprobe", "nvidia").returncode == 0
    assert len(ht.run(kpro6, "nvidia-smi", "-L").stdout.splitlines()) == 8
    missing = ht.run(kpro6, "modprobe", "nvidia_peermem")
    assert (
        missing.stderr
        == f"modprobe: FATAL: Module nvidia_peermem not found in directory /lib/modules/{NEW}\n"
    )


@needs_build
@as_root
def test_nvidia_modprobe_makes_uvm_nodes_with_the_live_major(kpro6: Path) -> None:
    assert ht.run(kpro6, "nvidia-modprobe", "-u", "-c=0").returncode == 0
    major = hwsim.Hw(kpro6).state["majors"]["nvidia-uvm"]
    assert os.major((kpro6 / "dev/nvidia-uvm").stat().st_rdev) == major
    assert os.minor((kpro6 / "dev/nvidia-uvm-tools").stat().st_rdev) == 1
    assert f"{major} nvidia-uvm\n" in (kpro6 / "proc/devices").read_text()
    assert ht.run(kpro6, "nvidia-modprobe", "-c=9").returncode == 1  # no GPU with minor 9


@needs_build
@as_root
def test_nodes_come_only_from_nvidia_modprobe(tmp_path: Path) -> None:
    root = ht.make_root(tmp_path, "kpro6")
    ht.ModuleCache().install(root, NEW)
    ht.boot_root(root, "kpro6")
    hw = hwsim.Hw(root)
    assert hw.loaded("nvidia") and not list((root / "dev").glob("nvidia*"))
    info = sorted((root / "proc/driver/nvidia/gpus").glob("*/information"))[0].read_text()
    assert "Device Minor: \t 0\n" in info  # the H200 capture's line
    assert ht.run(root, "nvidia-modprobe", "-c", "1").returncode == 0
    assert sorted(p.name for p in (root / "dev").glob("nvidia*")) == ["nvidia1", "nvidiactl"]
    assert (root / "dev/nvidiactl").stat().st_rdev == os.makedev(195, 255)
    cap = "/proc/driver/nvidia/capabilities/mig/monitor"
    assert "DeviceFileMinor: 2\n" in (root / cap.lstrip("/")).read_text()
    assert ht.run(root, "nvidia-modprobe", "-f", cap).returncode == 0
    st = (root / "dev/nvidia-caps/nvidia-cap2").stat()
    assert st.st_rdev == os.makedev(hw.state["majors"]["nvidia-caps"], 2)
    assert stat.S_IMODE(st.st_mode) == 0o444
    assert ht.run(root, "nvidia-modprobe", "-f", "/proc/nope").returncode == 1
    assert not (root / "dev/nvidia-uvm").exists()


@needs_build
@as_root
def test_sysfs_writes_rebind_a_gpu_to_vfio(kpro6: Path) -> None:
    bdf = "0000:c1:00.0"
    (kpro6 / f"sys/bus/pci/devices/{bdf}/driver_override").write_text("vfio-pci\n")
    (kpro6 / "sys/bus/pci/drivers/nvidia/unbind").write_text(bdf + "\n")
    (kpro6 / "sys/bus/pci/drivers_probe").write_text(bdf + "\n")
    assert hwsim.apply_sysfs_writes(kpro6)
    assert os.readlink(kpro6 / f"sys/bus/pci/devices/{bdf}/driver").endswith("/vfio-pci")
    assert (kpro6 / "sys/bus/pci/drivers/nvidia/unbind").read_text() == ""
    assert len(ht.run(kpro6, "nvidia-smi", "-L").stdout.splitlines()) == 7


@needs_build
def test_userspace_driver_mismatch(kpro6: Path) -> None:
    lib = kpro6 / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.535.161.08"
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.write_bytes(b"")
    try:
        got = ht.run(kpro6, "nvidia-smi")
        assert (got.returncode, got.stdout) == (
            18,
            "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.161.08\n",
        )
    finally:
        lib.unlink()


def test_dmesg_prints_the_simulated_log(kpro6: Path) -> None:
    got = ht.run(kpro6, "dmesg").stdout
    assert got.splitlines()[0].endswith(
        f"Linux version {NEW} (build@proxmox) (gcc (Debian 12.2.0-14+deb12u1) 12.2.0,"
        " GNU ld (GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC PMX"
        " 6.14.8-2~bpo12+1 (2025-07-22T10:04Z)"
    )


def test_install_diverts_packaged_binaries(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for d in ("var/lib/dpkg/info", "usr/bin", "usr/sbin"):
        (root / d).mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    (root / "sbin").symlink_to("usr/sbin")
    (root / "var/lib/dpkg/status").write_text("")
    shutil.copy2("/usr/bin/uname", root / "usr/bin/uname")
    if shutil.which("dpkg-divert") is None:
        pytest.skip("dpkg-divert not installed")
    hardware.install(root, load_profile("h200x2"))
    assert (root / "usr/bin/uname.distrib").exists()
    assert "gpuhost twin" in (root / "usr/bin/uname").read_text()
    assert "local diversion of /bin/uname to /bin/uname.distrib" in (
        os.popen(f"dpkg-divert --root={root} --list").read()
    )
    hardware.install(root, load_profile("h200x2"))  # idempotent
    assert (root / "usr/local/bin/nvidia-smi").stat().st_mode & 0o111
