"""Bootable Debian disk images for the vm tier, built from Debian's packages and cached by recipe.

``base_image(suite, layout, kernel_debs)`` returns a qcow2 image that OVMF boots the way a
Proxmox host of that boot path does (docs/reference/trial-boot.md §0):

    grub          GPT, a vfat ESP mounted at /boot/efi, ext4 root holding /boot; grub-efi-amd64
                  installed on the ESP (EFI/BOOT/BOOTX64.EFI and EFI/debian), /boot/grub/grub.cfg
                  (a PVE ext4/xfs UEFI install, with a plain partition instead of LVM)
    grub-sb       grub with Secure Boot: Debian's signed shim and GRUB on the ESP, Debian's
                  signed kernel the pinned default beside the unsigned -pve ones (PVE 8.1+'s
                  Secure Boot installs)
    grub-esp      GRUB on the ESP with --boot-directory on it (<ESP>/grub/grub.cfg, grubenv),
                  kernels at the ESP's root, the ESP not mounted, its UUID in
                  /etc/kernel/proxmox-boot-uuids (proxmox-boot-tool's `grub` mode, §2.4)
    bios-lvm      legacy BIOS (SeaBIOS): a BIOS boot partition with GRUB's i386-pc core, LVM
                  VG pve with LV root holding /boot (a PVE ext4 install on BIOS), no ESP
    systemd-boot  systemd-bootx64.efi as EFI/BOOT/BOOTX64.EFI, loader.conf and one entry per
                  kernel as proxmox-boot-tool writes them (§1.1), the ESP not mounted

Cache layout (under GPUHOST_TWIN_CACHE, default /var/cache/gpuhost-twin):

    vm/stage-<suite>-<hash>/            debootstrap of the common packages (a directory tree)
    vm/<suite>-<layout>-<hash>/         disk.qcow2, image.json (VmImage), build.log
    vm/debian-kernel-<suite>/*.deb      Debian's own kernel, for use before the -pve one exists

An image's hash covers the suite, layout, packages, the kernel .debs' contents, the client's
public key and this module's source, so changing any of them builds a new image; the stage's hash
covers only suite and packages. One flock serialises builds, so concurrent pytest workers build
once and the others find the result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from twin import rootfs
from twin.vm import lvm
from twin.vm.imagefs import (
    IN_IMAGE,
    IN_IMAGE_HEAD,
    IN_IMAGE_TAIL,
    LAYOUT_STEPS,
    QEMU,
    STANDIN,
    STANDIN_FILES,
    Build,
    ImageError,
    chroot_mounts,
    client_key,
    configure,
    finish,
    run,
    run_in_image,
    say,
)

CACHE = rootfs.CACHE_ROOT / "vm"
DISK_MIB = 3072  # virtual size; the qcow2 holds only what is written (about 1 GiB)
ESP_MIB = 256
LAYOUTS = ("grub", "grub-sb", "grub-esp", "bios-lvm", "systemd-boot")
BIOS_LAYOUTS = ("bios-lvm",)  # booted by SeaBIOS; the others by OVMF
# What every image has: an init system and udev, sshd for pyinfra, initramfs-tools and kmod
# for the kernels (linux-base: Debian's linux-image depends on it), the filesystems' tools,
# python3 (pyinfra's facts and gpuhost's stand-in tools), lspci, ip, ps, mount.
COMMON = (
    "systemd-sysv",
    "udev",
    "openssh-server",
    "initramfs-tools",
    "kmod",
    "linux-base",
    "e2fsprogs",
    "dosfstools",
    "python3",
    "pciutils",
    "iproute2",
    "procps",
    "util-linux",
)
LOADER = {
    "grub": ("grub-efi-amd64",),
    "grub-sb": ("grub-efi-amd64", "grub-efi-amd64-signed", "shim-signed", "mokutil"),
    "grub-esp": ("grub-efi-amd64",),
    "bios-lvm": ("grub-pc", "lvm2"),
    # bootctl, and systemd-bootx64.efi (bookworm's systemd-boot depends on systemd-boot-efi,
    # trixie's only recommends it)
    "systemd-boot": ("systemd-boot", "systemd-boot-efi"),
}
# What a suite needs beyond COMMON, where its package names differ. None so far: trixie's
# systemd package still carries networkd (a trixie image builds from the same list).
SUITE_EXTRA: dict[str, tuple[str, ...]] = {"bookworm": (), "trixie": ()}


@dataclass(frozen=True)
class VmImage:
    path: Path  # the cached qcow2; never written: VMs run on overlays of it
    suite: str
    layout: str
    kernels: tuple[str, ...]  # the kernel releases installed, e.g. ("6.1.0-37-amd64",)
    root_uuid: str  # ext4 UUID, the root= of every boot entry
    esp_uuid: str  # vfat serial as /dev/disk/by-uuid shows it, e.g. "1A2B-3C4D"
    host_key: str  # "ssh-ed25519 AAAA..." of the image's sshd

    def known_hosts_line(self, port: int) -> str:
        return f"[127.0.0.1]:{port} {self.host_key}\n"


def packages(suite: str, layout: str) -> tuple[str, ...]:
    return (*COMMON, *SUITE_EXTRA[rootfs.check_suite(suite)], *LOADER[_check_layout(layout)])


def _check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ImageError(f"unknown VM image layout {layout!r}; known: {', '.join(LAYOUTS)}")
    return layout


def image_key(suite: str, layout: str, kernel_debs: Sequence[Path]) -> str:
    recipe = [suite, layout, *packages(suite, layout), str(DISK_MIB), str(ESP_MIB)]
    recipe += sorted(_sha256(Path(d)) for d in kernel_debs)
    recipe += [
        Path(f"{client_key()}.pub").read_text(),
        inspect.getsource(sys.modules[__name__]),
        inspect.getsource(sys.modules["twin.vm.imagefs"]),
        inspect.getsource(lvm),
        *((STANDIN / name).read_text() for name in STANDIN_FILES),
    ]
    return hashlib.sha256("\n".join(recipe).encode()).hexdigest()[:16]


def base_image(suite: str, layout: str, kernel_debs: Sequence[Path]) -> VmImage:
    """The cached image of this recipe, built first (several minutes) when there is none."""
    if not kernel_debs:
        raise ImageError("base_image needs the kernel as .deb files (linux-image-*.deb)")
    target = CACHE / f"{suite}-{layout}-{image_key(suite, layout, kernel_debs)}"
    with _lock():
        if not (target / "image.json").exists():
            _build(target, suite, layout, [Path(d).resolve() for d in kernel_debs])
    meta = json.loads((target / "image.json").read_text())
    return VmImage(**{**meta, "path": target / "disk.qcow2", "kernels": tuple(meta["kernels"])})


def debian_kernel(suite: str = rootfs.SUITE) -> list[Path]:
    """Debian's own kernel image .deb (linux-image-amd64's current ABI), fetched once with apt
    inside the stage: a kernel to develop and test with until the -pve build is at hand."""
    out = CACHE / f"debian-kernel-{suite}"
    with _lock():
        if not list(out.glob("linux-image-*.deb")):
            stage = _stage(suite)
            deps = run(["chroot", stage, "apt-cache", "depends", "linux-image-amd64"])
            (image,) = re.findall(r"Depends: (linux-image-\S+)", deps)
            tmp = Path(tempfile.mkdtemp(dir=stage / "tmp"))
            run(["chroot", stage, "sh", "-c", f'cd "/tmp/{tmp.name}" && apt-get download -q "$1"',
                  "sh", image])  # fmt: skip
            out.mkdir(parents=True, exist_ok=True)
            for deb in tmp.glob("*.deb"):
                shutil.move(deb, out / deb.name)
            shutil.rmtree(tmp)
    return sorted(out.glob("linux-image-*.deb"))


def debian_debs(packages: Sequence[str], suite: str = rootfs.SUITE) -> list[Path]:
    """Debian's .debs of ``packages`` and of what they need beyond the stage's own packages,
    fetched once with apt inside the stage (never installed there): for a test to install
    into a VM, which has no network."""
    key = hashlib.sha256(" ".join(sorted(packages)).encode()).hexdigest()[:12]
    out = CACHE / f"debs-{suite}-{key}"
    with _lock():
        if not (out / ".done").exists():
            stage = _stage(suite)
            tmp = Path(tempfile.mkdtemp(dir=stage / "tmp"))
            (tmp / "partial").mkdir()
            run(["chroot", stage, "apt-get", "install", "-q", "-y", "--download-only",
                 "--no-install-recommends", "-o", f"Dir::Cache::archives=/tmp/{tmp.name}",
                 *packages])  # fmt: skip
            out.mkdir(parents=True, exist_ok=True)
            for deb in tmp.glob("*.deb"):
                shutil.move(deb, out / deb.name)
            shutil.rmtree(tmp)
            (out / ".done").touch()
    return sorted(out.glob("*.deb"))


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    CACHE.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a waiter then finds it done
        yield


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _stage(suite: str) -> Path:
    """debootstrap of COMMON, cached per suite (caller holds the lock): the slow, rarely changing
    part, so a new kernel or layout only costs the image steps."""
    names = (*COMMON, *SUITE_EXTRA[suite])
    digest = hashlib.sha256(
        "\n".join([suite, *names, inspect.getsource(_stage)]).encode()
    ).hexdigest()[:16]
    stage = CACHE / f"stage-{suite}-{digest}"
    if (stage / ".stage").exists():
        return stage
    mirror = rootfs.find_mirror(suite=suite)
    tmp = stage.with_name(stage.name + ".building")
    if tmp.exists():
        rootfs._unmount_below(tmp)
        shutil.rmtree(tmp)
    cmd = ["debootstrap", "--variant=minbase", "--components=main", f"--include={','.join(names)}"]
    cmd += [f"--keyring={mirror.keyring}"] if mirror.keyring else []
    cmd += [suite, str(tmp), mirror.uri]
    log = CACHE / f"stage-{suite}.log"
    t0 = time.monotonic()
    say(f"debootstrap {suite} for the VM images (one time; log: {log})")
    try:
        with open(log, "w") as out:
            rootfs._debootstrap(cmd, out, say, t0)
    except subprocess.CalledProcessError as exc:
        raise ImageError(f"debootstrap failed; see {log}") from exc
    finally:
        rootfs._unmount_below(tmp)
    (tmp / ".stage").write_text(suite + "\n")
    tmp.rename(stage)
    say(f"  stage ready in {time.monotonic() - t0:.0f} s")
    return stage


def _build(target: Path, suite: str, layout: str, debs: list[Path]) -> None:
    """Partition a sparse raw disk on a loop device, fill it from the stage, install the loader
    packages and the kernels in a chroot, lay out the boot path, then convert it to qcow2.

    The ESP is never mounted on the build machine (its kernel may have no vfat, as this CI's
    has not): systemd-boot's files are copied onto it with mtools, and GRUB's steps
    (grub-install, update-grub) run in the image's own kernel, booted once by OVMF."""
    if missing():
        raise ImageError(f"{', '.join(missing())} missing; install: {' '.join(APT_TOOLS)}")
    t0 = time.monotonic()
    stage = _stage(suite)
    tmp = target.with_name(target.name + ".building")
    if tmp.exists():
        rootfs._unmount_below(tmp)
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    say(f"building the {suite} {layout} VM image (log: {tmp / 'build.log'})")
    raw, esp = tmp / "disk.raw", tmp / "esp"
    esp.mkdir()
    with contextlib.ExitStack() as undo:
        b = Build(tmp / "build.log", undo)
        with open(raw, "wb") as f:
            f.truncate(DISK_MIB << 20)  # sparse: only written blocks take space
        bios = layout in BIOS_LAYOUTS
        first = ["1:1MiB:+1MiB", "1:ef02", "1:BIOS boot"] if bios else [
            f"1:1MiB:+{ESP_MIB}MiB", "1:ef00", "1:EFI system partition"]  # fmt: skip
        second = ["2:8e00", "2:pve"] if bios else ["2:8304", "2:root"]
        b.run(["sgdisk", "-n", first[0], "-t", first[1], "-c", first[2],
               "-n", "2:0:0", "-t", second[0], "-c", second[1], raw])  # fmt: skip
        loop = b.run(["losetup", "--show", "-f", "-P", raw]).strip()
        undo.callback(b.run, ["losetup", "-d", loop])
        esp_dev, root_dev = f"{loop}p1", f"{loop}p2"
        if not Path(esp_dev).exists():  # a kernel without GPT parsing (CONFIG_EFI_PARTITION)
            b.run(["partx", "-a", loop])  # adds the partitions through BLKPG instead
        if bios:
            root_dev = lvm.root_lv(b, root_dev)
        else:
            b.run(["mkfs.vfat", "-F", "32", "-n", "ESP", esp_dev])
        b.run(["mkfs.ext4", "-q", "-L", "root", root_dev])
        root_uuid = b.run(["blkid", "-s", "UUID", "-o", "value", root_dev]).strip()
        esp_uuid = "" if bios else b.run(["blkid", "-s", "UUID", "-o", "value", esp_dev]).strip()
        b.root = tmp / "root"
        b.mount(root_dev, b.root)
        b.run(["cp", "-a", f"{stage}/.", b.root])
        (b.root / ".stage").unlink()
        if layout.startswith("grub"):
            (b.root / "boot/efi").mkdir(exist_ok=True)  # where IN_IMAGE mounts the ESP
        chroot_mounts(b)
        configure(b, layout, root_uuid, esp_uuid)
        kdir = b.root / "tmp/kernel-debs"
        kdir.mkdir()
        for deb in debs:
            shutil.copy(deb, kdir / deb.name)
        # apt, not bare dpkg -i: a headers .deb brings dependencies (its -common, kbuild).
        b.chroot("apt-get", "install", "-y", "-q", "--no-install-recommends", *LOADER[layout],
                 *(f"/tmp/kernel-debs/{d.name}" for d in debs))  # fmt: skip
        shutil.rmtree(kdir)
        boot = b.root / "boot"
        kernels = tuple(sorted(p.name[len("vmlinuz-") :] for p in boot.glob("vmlinuz-*")))
        if not kernels:
            raise ImageError(f"no /boot/vmlinuz-* after installing {[d.name for d in debs]}")
        script = LAYOUT_STEPS[layout](b, esp, kernels, root_uuid, esp_uuid)
        b.write(IN_IMAGE, IN_IMAGE_HEAD + script + IN_IMAGE_TAIL, 0o755)  # run at the end
        for name in (f"vmlinuz-{kernels[-1]}", f"initrd.img-{kernels[-1]}"):
            shutil.copy(boot / name, tmp / name)
        host_key = finish(b)
        undo.close()  # unmount everything, detach the loop device
    if any(esp.iterdir()):
        offset = f"{raw}@@1M"  # mtools reaches the ESP inside the raw disk at its offset
        b.run(["mcopy", "-s", "-i", offset, *sorted(esp.iterdir()), "::"])
    run_in_image(b, tmp, raw, kernels[-1], lvm.ROOT_DEVICE if bios else f"UUID={root_uuid}")
    b.run(["qemu-img", "convert", "-O", "qcow2", raw, tmp / "disk.qcow2"])
    for leftover in (raw, *tmp.glob("vmlinuz-*"), *tmp.glob("initrd.img-*")):
        leftover.unlink()
    meta = VmImage(tmp / "disk.qcow2", suite, layout, kernels, root_uuid, esp_uuid, host_key)
    (tmp / "image.json").write_text(json.dumps({**asdict(meta), "path": "disk.qcow2"}, indent=1))
    tmp.rename(target)
    size = (target / "disk.qcow2").stat().st_size >> 20
    say(f"  {layout} image ready in {time.monotonic() - t0:.0f} s ({size} MiB): {target}")


APT_TOOLS = (
    "debootstrap",
    "lvm2",
    "gdisk",
    "dosfstools",
    "mtools",
    "qemu-utils",
    "qemu-system-x86",
    "ovmf",
)
TOOLS = ("debootstrap", "sgdisk", "partx", "losetup", "mkfs.vfat", "mcopy", "qemu-img", QEMU)
TOOLS += ("pvcreate", "vgcfgrestore")


def missing() -> list[str]:
    """The image build's tools this machine lacks (empty when it has them all)."""
    return [t for t in TOOLS if not shutil.which(t, path="/usr/sbin:/usr/bin:/sbin:/bin")]
