"""The vm tier's two kernels: Debian's linux-source-6.1, built into .debs by gpuhost's own build.

``vm_kernels()`` returns an "old" release (the one the disk image boots) and a "new" one (what a
kernel trial boots), building whichever is missing, into an artifact store of their own:

    $GPUHOST_TEST_CACHE/vm-store/   kernel/<release>/..., kernel-inputs/... (gpuhost's layout)
    $GPUHOST_TEST_CACHE/vm-bin/     gcc-12: the compiler both builds run (through ccache if any)
    $GPUHOST_TEST_CACHE/vm-ccache/  ccache's objects, where ccache is installed
    $GPUHOST_TEST_CACHE/vm-store.lock   held while building (concurrent workers build once)

The source is tests/build/kernel_cache.py's unpacked tree (read only: builds are out of tree).
The two recipes differ in LOCALVERSION alone, so with ccache the second build compiles only
what includes the release string (init/version.c, the modules' vermagic); it still configures,
links and packages in an empty work directory as every gpuhost build does.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from gpuhost.build.artifacts import Artifact, ArtifactStore
from gpuhost.build.kernel import KernelRecipe, inputs_hash, local_jobs, lookup, tree_version
from gpuhost.build.kernelbuild import build

# The build tier's kernel cache owns the unpacked tree and the skip test; calling it (tests/ is
# on sys.path in test runs and from the repository root) keeps one unpacked 1.3 GB tree per machine.
from tests.build.kernel_cache import _drop_others, cache_dir, source_tree
from tests.build.kernel_cache import missing as build_missing

# -N-pve: the release then reads like a Proxmox one (gpuhost refuses others); 7 and 8 cannot
# collide with the build tier's -1-pve, whose cache drops every other config of its release.
OLD_LOCALVERSION = "-7-pve"  # the image's kernel
NEW_LOCALVERSION = "-8-pve"  # the kernel a trial boot tries
CC = "gcc-12"
BASE_CONFIG = "tinyconfig"
# On top of tinyconfig (which turns off everything an EXPERT may, even /proc and ELF): what a
# Debian 12/13 systemd userspace, booted by OVMF from virtio-blk and reached over SSH, needs, and
# what the tier tests (IOMMU, VFIO, watchdogs, panics, one-shot boots). Every entry must survive
# Kconfig (gpuhost's build refuses a dropped one), so dependencies are listed, not implied.
FRAGMENT = {
    # -- a 64-bit SMP kernel with modules (the headers .deb, vfio-pci and xhci_pci are modules)
    "CONFIG_64BIT": "y",  # ARCH=x86_64 makes it so; stated so that losing it is refused by name
    "CONFIG_SMP": "y",  # the VMs run -smp 2
    "CONFIG_MODULES": "y",  # vfio-pci/xhci_pci as modules: the initramfs claim is testable
    "CONFIG_MODULE_UNLOAD": "y",  # rmmod, and rebinding drivers in tests
    "CONFIG_BASE_FULL": "y",  # normal table sizes (tinyconfig's pid_max is 4096)
    "CONFIG_NO_HZ_IDLE": "y",  # no timer ticks while idle: idle VMs cost little host CPU under TCG
    "CONFIG_HIGH_RES_TIMERS": "y",  # ... and timers without a periodic tick
    "CONFIG_PRINTK": "y",  # a console at all
    "CONFIG_PRINTK_TIME": "y",  # boot timings in the console log
    "CONFIG_BUG": "y",  # BUG()/WARN() say where
    "CONFIG_KALLSYMS": "y",  # readable panics (symbol names in backtraces)
    "CONFIG_EARLY_PRINTK": "y",  # earlyprintk=serial when a boot dies before the console
    # -- what init, udev, systemd and sshd call (tinyconfig drops them all)
    "CONFIG_BINFMT_ELF": "y",  # run ELF binaries
    "CONFIG_BINFMT_SCRIPT": "y",  # #! scripts: the initramfs's /init is one
    "CONFIG_MULTIUSER": "y",  # uids/gids, setuid: sshd privilege separation
    "CONFIG_PROC_FS": "y",  # /proc
    "CONFIG_PROC_SYSCTL": "y",  # /proc/sys: kernel.panic and friends
    "CONFIG_SYSFS": "y",  # /sys: udev, systemd
    "CONFIG_FUTEX": "y",  # glibc threads
    "CONFIG_EPOLL": "y",  # systemd's event loop
    "CONFIG_SIGNALFD": "y",  # systemd, udev
    "CONFIG_TIMERFD": "y",  # systemd timers
    "CONFIG_EVENTFD": "y",  # systemd; VFIO's interrupts
    "CONFIG_FHANDLE": "y",  # systemd/udev (name_to_handle_at)
    "CONFIG_POSIX_TIMERS": "y",  # timer_create, clock_nanosleep
    "CONFIG_FILE_LOCKING": "y",  # flock/fcntl locks: dpkg, systemd
    "CONFIG_SHMEM": "y",  # real tmpfs and memfd
    "CONFIG_ADVISE_SYSCALLS": "y",  # madvise/fadvise (journald, glibc)
    "CONFIG_SYSVIPC": "y",  # System V IPC (asked for; some daemons use it)
    "CONFIG_POSIX_MQUEUE": "y",  # systemd mounts /dev/mqueue
    "CONFIG_TTY": "y",  # terminals at all
    "CONFIG_UNIX98_PTYS": "y",  # sshd's sessions get ptys
    "CONFIG_SECCOMP": "y",  # systemd's SystemCallFilter= (seccomp filter follows with NET)
    "CONFIG_SECCOMP_FILTER": "y",  # ... stated so that losing it is refused by name
    "CONFIG_CGROUPS": "y",  # systemd needs cgroup2 (unified only in systemd 257)
    "CONFIG_NAMESPACES": "y",  # systemd's sandboxing (PrivateTmp=, ProtectHostname=...)
    "CONFIG_UTS_NS": "y",  # ProtectHostname=
    "CONFIG_IPC_NS": "y",  # PrivateIPC=
    "CONFIG_PID_NS": "y",  # PrivatePIDs=, containers
    "CONFIG_NET_NS": "y",  # PrivateNetwork=
    "CONFIG_USER_NS": "y",  # PrivateUsers=
    "CONFIG_INOTIFY_USER": "y",  # systemd path units, udev
    "CONFIG_DEVTMPFS": "y",  # /dev: initramfs-tools and systemd mount it
    "CONFIG_TMPFS": "y",  # /run, /tmp, /dev/shm
    "CONFIG_TMPFS_POSIX_ACL": "y",  # systemd sets ACLs on /run/log/journal
    "CONFIG_TMPFS_XATTR": "y",  # systemd's xattrs on cgroups/tmpfs
    "CONFIG_AUTOFS_FS": "y",  # systemd automount units (binfmt_misc, fstab x-systemd.automount)
    "CONFIG_DMI": "y",  # systemd-detect-virt, udev hwdb match on DMI
    "CONFIG_DMIID": "y",  # ... exported in /sys/class/dmi/id
    "CONFIG_BLK_DEV_INITRD": "y",  # initramfs-tools' initrd
    "CONFIG_RD_GZIP": "y",  # initrds compressed by gzip (initramfs-tools' COMPRESS=gzip)
    "CONFIG_RD_ZSTD": "y",  # initramfs-tools' default on Debian 12 and 13
    # -- firmware, buses, console
    "CONFIG_ACPI": "y",  # q35's devices, power button, IOMMU tables (DMAR/IVRS)
    "CONFIG_ACPI_BUTTON": "y",  # system_powerdown shuts the guest down cleanly
    "CONFIG_INPUT": "y",  # ... the button is an input device
    "CONFIG_INPUT_EVDEV": "y",  # ... which systemd-logind reads
    "CONFIG_EFI": "y",  # OVMF: EFI runtime services
    "CONFIG_EFI_STUB": "y",  # systemd-boot starts EFI-stub kernels; GRUB too
    "CONFIG_EFIVAR_FS": "y",  # bootctl, LoaderEntryOneShot (built in: no module to find)
    "CONFIG_SERIAL_8250": "y",  # ttyS0: the test's only console
    "CONFIG_SERIAL_8250_CONSOLE": "y",  # console=ttyS0
    "CONFIG_PCI": "y",  # every device of the VM
    "CONFIG_PCI_MMCONFIG": "y",  # q35's PCIe extended config space (ACS, IOMMU groups)
    "CONFIG_PCI_QUIRKS": "y",  # the ACS/IOMMU-group quirks real hosts get
    "CONFIG_PCIEPORTBUS": "y",  # pcie-root-port devices
    "CONFIG_PCI_MSI": "y",  # MSI/MSI-X: virtio, xHCI, VFIO
    # -- IOMMU and VFIO: what gpuhost's passthrough checks read
    "CONFIG_IOMMU_SUPPORT": "y",  # the IOMMU drivers' menu
    "CONFIG_INTEL_IOMMU": "y",  # -device intel-iommu (DMAR)
    "CONFIG_AMD_IOMMU": "y",  # -device amd-iommu (IVRS)
    "CONFIG_IRQ_REMAP": "y",  # interrupt remapping: VFIO refuses unsafe interrupts without it
    "CONFIG_VFIO": "m",  # a module, loaded with vfio-pci
    "CONFIG_VFIO_PCI": "m",  # a module so that the initramfs claim (vfio-pci before xhci_pci) is real
    # -- USB: a passthrough candidate that has a host driver to take it from
    "CONFIG_USB_SUPPORT": "y",  # the USB menu
    "CONFIG_USB": "y",  # USB core
    "CONFIG_USB_PCI": "y",  # host controllers on PCI
    "CONFIG_USB_XHCI_HCD": "m",  # xHCI core; a module, as Debian's: xhci_pci (no prompt of its
    "CONFIG_USB_XHCI_PCI": "m",  # own) is a module only so; an initramfs binds vfio-pci first
    # -- watchdogs and the panics they cause
    "CONFIG_WATCHDOG": "y",  # the watchdog menu
    "CONFIG_WATCHDOG_CORE": "y",  # /dev/watchdog0 (systemd's RuntimeWatchdogSec=)
    "CONFIG_I6300ESB_WDT": "m",  # -device i6300esb: a hardware watchdog
    "CONFIG_SOFT_WATCHDOG": "m",  # softdog: a watchdog without hardware
    "CONFIG_DEBUG_KERNEL": "y",  # the lockup detectors live behind it
    "CONFIG_SOFTLOCKUP_DETECTOR": "y",  # /proc/sys/kernel/softlockup_panic
    "CONFIG_HARDLOCKUP_DETECTOR": "y",  # /proc/sys/kernel/hardlockup_panic (perf NMI based)
    "CONFIG_DETECT_HUNG_TASK": "y",  # /proc/sys/kernel/hung_task_panic
    "CONFIG_MAGIC_SYSRQ": "y",  # echo c > /proc/sysrq-trigger: a real panic on demand
    # -- storage: GPT disk on virtio-blk, vfat ESP, ext4 root, later LVM
    "CONFIG_BLOCK": "y",  # block devices at all
    "CONFIG_PARTITION_ADVANCED": "y",  # choose the partition tables below
    "CONFIG_EFI_PARTITION": "y",  # GPT
    "CONFIG_MSDOS_PARTITION": "y",  # MBR
    "CONFIG_VIRTIO_MENU": "y",  # the virtio drivers' menu
    "CONFIG_VIRTIO_PCI": "y",  # virtio devices on PCI
    "CONFIG_BLK_DEV": "y",  # the block drivers' menu
    "CONFIG_VIRTIO_BLK": "y",  # the disk, built in: root needs no module
    "CONFIG_MD": "y",  # the device-mapper menu
    "CONFIG_BLK_DEV_DM": "y",  # device-mapper, for an LVM image
    "CONFIG_EXT4_FS": "y",  # the root filesystem
    "CONFIG_EXT4_FS_POSIX_ACL": "y",  # systemd-journald's ACLs on /var/log/journal
    "CONFIG_CRYPTO_CRC32C": "y",  # ext4 metadata_csum (mke2fs's default)
    "CONFIG_VFAT_FS": "y",  # the ESP (/boot/efi)
    "CONFIG_NLS_CODEPAGE_437": "y",  # vfat's default codepage
    "CONFIG_NLS_ISO8859_1": "y",  # vfat's default iocharset on Debian
    # -- network: DHCP from QEMU user networking, sshd through hostfwd
    "CONFIG_NET": "y",  # sockets at all
    "CONFIG_UNIX": "y",  # unix sockets: systemd, journald, D-Bus
    "CONFIG_INET": "y",  # IPv4
    "CONFIG_IPV6": "y",  # IPv6 (systemd expects it)
    "CONFIG_PACKET": "y",  # DHCP clients send raw packets
    "CONFIG_NETDEVICES": "y",  # the network drivers' menu
    "CONFIG_NET_CORE": "y",  # ... and its core drivers' menu
    "CONFIG_VIRTIO_NET": "y",  # -device virtio-net-pci
    "CONFIG_ETHERNET": "y",  # the Ethernet drivers' menu
    "CONFIG_NET_VENDOR_INTEL": "y",  # ... Intel's
    "CONFIG_E1000E": "m",  # -device e1000e: a NIC behind a pcie-root-port, its own IOMMU group
}


class Debs(NamedTuple):
    image: Path  # linux-image-<release>_<version>_amd64.deb
    headers: Path  # linux-headers-<release>_<version>_amd64.deb


class VmKernels(NamedTuple):
    store: Path  # the artifact store that holds both (ArtifactStore(store))
    old: str  # e.g. 6.1.192-7-pve: the release the image boots
    new: str  # e.g. 6.1.192-8-pve: the release a trial boot tries
    compiler: str  # CONFIG_CC_VERSION_TEXT, e.g. gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0
    old_debs: Debs
    new_debs: Debs


WRAPPER = f"""#!/bin/sh
# gpuhost vm tier: the kernels' compiler, {CC} through ccache where ccache is installed (the
# objects are the same; the second release then recompiles only what names the release).
if command -v ccache >/dev/null 2>&1; then
    CCACHE_DIR="${{0%/*}}/../vm-ccache" exec ccache /usr/bin/{CC} "$@"
fi
exec /usr/bin/{CC} "$@"
"""


def missing() -> list[str]:
    """What this machine lacks to build the kernels (empty: it can), for a skip message."""
    return build_missing()


def store_dir() -> Path:
    return cache_dir() / "vm-store"


def recipe(tree: Path, localversion: str) -> KernelRecipe:
    """The recipe `gpuhost build` would make for a spec with this kernel (see kernel_cache)."""
    return KernelRecipe(
        tree=tree,
        base_config=BASE_CONFIG,
        release=tree_version(tree) + localversion,
        localversion=localversion,
        cc=CC,
        fragment=dict(FRAGMENT),
    )


@contextmanager
def _compiler_on_path(cache: Path) -> Iterator[None]:
    """PATH with vm-bin first (its gcc-12 is WRAPPER; the inputs hash covers its bytes)."""
    bindir = cache / "vm-bin"
    wrapper = bindir / CC
    if not wrapper.is_file() or wrapper.read_text() != WRAPPER:
        bindir.mkdir(parents=True, exist_ok=True)
        tmp = bindir / f".{CC}.{os.getpid()}"
        tmp.write_text(WRAPPER)
        tmp.chmod(0o755)
        tmp.rename(wrapper)  # atomic: a concurrent build never runs half a script
    saved = os.environ.get("PATH", "/usr/bin:/bin")
    os.environ["PATH"] = f"{bindir}:{saved}"
    try:
        yield
    finally:
        os.environ["PATH"] = saved


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _debs(artifact: Artifact) -> Debs:
    release = artifact.key.version
    image, headers = (
        next(artifact.file(n) for n in artifact.files if n.startswith(f"linux-{kind}-{release}_"))
        for kind in ("image", "headers")
    )
    return Debs(image, headers)


@functools.cache  # once per process: finding them hashes the 1.3 GB tree twice (seconds)
def vm_kernels() -> VmKernels:
    """Both kernels' store, releases and .debs, building what is missing (minutes each, its
    times printed to stderr; call ``missing()`` first to skip where it cannot run)."""
    cache = cache_dir()
    tree = source_tree(cache)  # before our lock: it takes kernel_cache's own while unpacking
    store = ArtifactStore(store_dir())
    found: list[Artifact] = []
    with _compiler_on_path(cache):
        for localversion in (OLD_LOCALVERSION, NEW_LOCALVERSION):
            r = recipe(tree, localversion)
            artifact = lookup(store, inputs_hash(r))
            if artifact is None:  # build under the lock; a worker that waited finds it built
                with _locked(cache / "vm-store.lock"):
                    artifact = _build(r, store, cache)
                    # An older FRAGMENT's build of this release would make deploys from this
                    # store refuse to choose between two configs: keep this one only.
                    _drop_others(store, artifact.key)
            found.append(artifact)
    old, new = found
    return VmKernels(
        store.root, old.key.version, new.key.version, old.key.compiler, _debs(old), _debs(new)
    )


def _build(r: KernelRecipe, store: ArtifactStore, cache: Path) -> Artifact:
    work = Path(tempfile.mkdtemp(prefix="vm-work-", dir=cache))
    try:
        wall, cpu = time.monotonic(), _children_cpu()
        result = build(r, store, work / "out", local_jobs())  # a found build returns at once
        if not result.cached:
            print(
                f"twin.vm.kernel: built {r.release} in {time.monotonic() - wall:.0f} s "
                f"({_children_cpu() - cpu:.0f} s CPU, load {os.getloadavg()[0]:.1f}, "
                f"ccache {'on' if shutil.which('ccache') else 'absent'})",
                file=sys.stderr,
                flush=True,
            )
        return result.artifact
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


if __name__ == "__main__":  # python -m twin.vm.kernel (from the repository root): build or find
    lacking = missing()
    if lacking:
        raise SystemExit(f"cannot build: missing {', '.join(lacking)}")
    print(vm_kernels())
