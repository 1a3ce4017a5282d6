"""What goes into a VM image's file system and boot path, for twin/vm/image.py: the build's
steps (a logged command, a chroot, mounts undone in reverse), the files every image gets (fstab,
network, sshd, the client key, gpuhost's stand-in proxmox-boot-tool), and each layout's loader
as a Proxmox host of that boot path has it (docs/reference/trial-boot.md §0): GRUB's steps run in
the image's own kernel, booted once by OVMF (the build machine's kernel may lack vfat)."""

from __future__ import annotations

import contextlib
import fcntl
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from twin import node, rootfs

CLIENT_KEY = node.STATE_ROOT / "vm" / "client" / "id_ed25519"
QEMU = "qemu-system-x86_64"

STANDIN = Path(__file__).parent / "standin"
STANDIN_FILES = ("proxmox_boot_tool.py", "pbt_functions.py")
STANDIN_DIR = "/usr/lib/gpuhost-standin"
STANDIN_TOOL = "/usr/sbin/proxmox-boot-tool"
STANDIN_HOOKS = (
    "/etc/kernel/postinst.d/zz-proxmox-boot",
    "/etc/kernel/postrm.d/zz-proxmox-boot",
    "/etc/initramfs/post-update.d/proxmox-boot-sync",
)


SERIAL = "console=ttyS0,115200"
ESP_MOUNTED = ("grub", "grub-sb")  # /boot on the root fs, the ESP at /boot/efi


class ImageError(RuntimeError):
    """A VM image cannot be built (missing tool, failed step); the message names the log."""


# Build steps run with a fixed environment: no prompts (apt, debconf), C messages in the log.
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "HOME": "/root"}
ENV |= {"DEBIAN_FRONTEND": "noninteractive", "MTOOLS_SKIP_CHECK": "1"}
ENV |= {"LVM_SUPPRESS_FD_WARNINGS": "1"}  # the build's inherited descriptors are no news


def run(
    argv: Sequence[str | Path],
    log: Path | None = None,
    stdin: str | None = None,
    timeout: float | None = None,
) -> str:
    """Run a build step (its output appended to log); a failure raises ImageError with the
    command's own last words."""
    args = [str(a) for a in argv]
    try:
        done = subprocess.run(
            args, input=stdin, capture_output=True, text=True, env=ENV, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{' '.join(args)} did not finish in {timeout} s") from exc
    if log is not None:
        with open(log, "a") as out:
            out.write(f"$ {' '.join(args)}\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-800:]
        where = f", see {log}" if log else ""
        raise ImageError(f"{' '.join(args)} failed ({done.returncode}){where}: {tail}")
    return done.stdout


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Build:
    """One image build: its log, its mounts (undone in reverse order) and the chroot."""

    def __init__(self, log: Path, undo: contextlib.ExitStack) -> None:
        self.log = log
        self.undo = undo
        self.root = Path()  # the mounted root fs, set once it is mounted

    def run(
        self, argv: Sequence[str | Path], stdin: str | None = None, timeout: float | None = None
    ) -> str:
        return run(argv, self.log, stdin, timeout)

    def chroot(self, *argv: str, stdin: str | None = None) -> str:
        return self.run(["chroot", self.root, *argv], stdin=stdin)

    def mount(self, source: str | Path, point: Path, *opts: str) -> None:
        point.mkdir(parents=True, exist_ok=True)
        self.run(["mount", *opts, source, point])
        self.undo.callback(self.run, ["umount", point])

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)


IN_IMAGE = "/usr/local/sbin/gpuhost-vm-build"
IN_IMAGE_HEAD = """#!/bin/sh
# The VM image build's last steps, run once as init by the image's own kernel (the build
# machine's kernel may have no vfat to mount the ESP with). Removes itself.
set -eux
/lib/systemd/systemd-udevd --daemon
udevadm trigger --action=add
udevadm settle  # /dev/disk/by-uuid: grub-mkconfig writes root=UUID= only when it exists
"""
IN_IMAGE_TAIL = f"""udevadm control --exit
rm -f {IN_IMAGE}
fstrim -v /  # QEMU turns the discards into holes in the raw file (the loop device did not)
sync
# This script, deleted but still open, keeps `mount -o remount,ro /` busy: sysrq's emergency
# remount forces it, so the image's root fs is left clean.
echo u >/proc/sysrq-trigger
until grep -q " / ext4 ro" /proc/mounts; do sleep 0.1; done
echo gpuhost-vm-build: done
echo o >/proc/sysrq-trigger
"""


def run_in_image(b: Build, tmp: Path, raw: Path, kver: str, root: str) -> None:
    """Boot the image's kernel (OVMF's direct kernel boot: a UEFI system, as on a real
    install) with IN_IMAGE as init, root= ``root``; its console goes to the build log."""
    console = tmp / "in-image.log"
    ovmf = Path("/usr/share/OVMF")
    shutil.copy(ovmf / "OVMF_VARS_4M.fd", tmp / "vars.fd")
    cmdline = f"root={root} rw {SERIAL} init={IN_IMAGE} panic=-1"
    argv: list[str | Path] = [QEMU, "-accel", "tcg", "-machine", "q35", "-cpu", "max", "-m", "1024"]
    argv += ["-nographic", "-monitor", "none", "-no-reboot", "-serial", f"file:{console}"]
    argv += ["-drive", f"if=pflash,format=raw,unit=0,readonly=on,file={ovmf}/OVMF_CODE_4M.fd"]
    argv += ["-drive", f"if=pflash,format=raw,unit=1,file={tmp}/vars.fd"]
    argv += ["-drive", f"file={raw},format=raw,if=virtio,discard=unmap", "-net", "none"]
    argv += ["-kernel", tmp / f"vmlinuz-{kver}", "-initrd", tmp / f"initrd.img-{kver}"]
    argv += ["-append", cmdline]
    try:
        b.run(argv, timeout=900)
    finally:
        text = console.read_text(errors="replace") if console.exists() else ""
        with open(b.log, "a") as log:
            log.write(f"--- the image's own boot ({console}) ---\n{text}")
        (tmp / "vars.fd").unlink(missing_ok=True)
    if "gpuhost-vm-build: done" not in text:
        tail = "\n".join(text.splitlines()[-30:])
        raise ImageError(f"the build's steps in the image failed, see {b.log}:\n{tail}")


def chroot_mounts(b: Build) -> None:
    """A private /dev for the chroot (a tmpfs: nothing leaks onto the machine's devtmpfs),
    proc and sys for update-initramfs and the postinsts, /run a tmpfs so nothing a postinst
    leaves there lands in the image."""
    dev = b.root / "dev"
    b.mount("tmpfs", dev, "-t", "tmpfs", "-o", "mode=755")
    rootfs.make_dev(dev)
    b.mount("devpts", dev / "pts", "-t", "devpts", "-o", "newinstance,ptmxmode=0666")
    b.mount("proc", b.root / "proc", "-t", "proc")
    b.mount("/sys", b.root / "sys", "--bind")
    b.mount("tmpfs", b.root / "run", "-t", "tmpfs", "-o", "mode=755")


def configure(b: Build, layout: str, root_uuid: str, esp_uuid: str) -> None:
    """Files written before any package or kernel install, so the initramfs and the postinsts
    see the final system: fstab, network, sshd, and no service started while building."""
    b.write("/usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", 0o755)
    # No fsck pass (a fresh image each VM; fsck cost 6 s of a boot under TCG)
    root = "/dev/pve/root" if layout == "bios-lvm" else f"UUID={root_uuid}"  # as PVE writes it
    fstab = f"{root} / ext4 errors=remount-ro 0 0\n"
    if layout in ESP_MOUNTED:  # a PVE ext4 UEFI install mounts its ESP; proxmox-boot-tool's not
        fstab += f"UUID={esp_uuid} /boot/efi vfat defaults 0 0\n"
    b.write("/etc/fstab", fstab)
    b.write("/etc/hostname", "gpuhost-vm\n")
    b.write("/etc/hosts", "127.0.0.1 localhost\n127.0.1.1 gpuhost-vm\n")
    b.write("/etc/resolv.conf", "nameserver 10.0.2.3\n")  # QEMU user networking's DNS
    b.write("/etc/systemd/network/20-wired.network", "[Match]\nName=en*\n\n[Network]\nDHCP=yes\n")
    b.chroot("systemctl", "enable", "systemd-networkd.service")
    b.chroot("systemctl", "mask", *UNNEEDED)
    b.write(
        "/etc/ssh/sshd_config.d/gpuhost-vm.conf",
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n",
    )
    b.write("/root/.ssh/authorized_keys", Path(f"{client_key()}.pub").read_text(), 0o600)
    (b.root / "root/.ssh").chmod(0o700)
    if layout == "bios-lvm":  # grub-install runs in the image's own kernel, on /dev/vda
        b.chroot("debconf-set-selections", stdin=(
            "grub-pc grub-pc/install_devices multiselect\n"
            "grub-pc grub-pc/install_devices_empty boolean true\n"))  # fmt: skip
    elif layout.startswith("grub"):
        # Keep EFI/BOOT/BOOTX64.EFI current on later grub-efi-amd64 upgrades; NVRAM is the VM's.
        b.chroot("debconf-set-selections", stdin=(
            "grub-efi-amd64 grub2/force_efi_extra_removable boolean true\n"
            "grub-efi-amd64 grub2/update_nvram boolean false\n"))  # fmt: skip
    else:
        b.write("/etc/kernel/cmdline", f"root=UUID={root_uuid} {SERIAL}\n")
    if layout not in (*ESP_MOUNTED, "bios-lvm"):
        b.write("/etc/kernel/proxmox-boot-uuids", f"{esp_uuid}\n")
    # Proxmox's proxmox-kernel-helper, which no package here provides: gpuhost's stand-in
    # (twin/vm/standin), as the tool and as the kernel and initramfs hooks it installs.
    for name in STANDIN_FILES:
        b.write(f"{STANDIN_DIR}/{name}", (STANDIN / name).read_text(), 0o755)
    for link in (STANDIN_TOOL, *STANDIN_HOOKS):
        b.chroot("mkdir", "-p", str(Path(link).parent))
        b.chroot("ln", "-sf", f"{STANDIN_DIR}/proxmox_boot_tool.py", link)


# Under TCG on shared cores every unit started costs the boot CPU time (each modprobe@ instance
# about 1.5 s): what a test VM never uses is masked. The timers never fire in a test's span; the
# serial console's getty stays (no VGA: -nodefaults), sshd and networkd stay.
UNNEEDED = (
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "fstrim.timer",
    "getty-static.service",
    "getty@tty1.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    *(f"modprobe@{m}.service" for m in ("dm_mod", "fuse", "loop", "efi_pstore", "drm")),
)


def default_grub(b: Build) -> None:
    """GRUB's menu and the kernel on the serial console, a short timeout, nothing on the
    default-only line, so a test sees exactly what gpuhost adds to GRUB_CMDLINE_LINUX_DEFAULT."""
    path = b.root / "etc/default/grub"
    text = path.read_text()
    for key, value in (
        ("GRUB_TIMEOUT", "1"),
        ("GRUB_CMDLINE_LINUX_DEFAULT", '""'),
        ("GRUB_CMDLINE_LINUX", f'"{SERIAL}"'),
        ("GRUB_TERMINAL", "serial"),
        ("GRUB_SERIAL_COMMAND", '"serial --unit=0 --speed=115200"'),
    ):
        line = f"{key}={value}"
        text, n = re.subn(rf"^#?{key}=.*$", line, text, count=1, flags=re.M)
        text += "" if n else f"{line}\n"
    path.write_text(text)


# A layout step writes what it can from the build machine and returns the shell commands that
# IN_IMAGE runs in the image's own kernel ("" when there are none).
EFI_INSTALL = "grub-install --target=x86_64-efi --efi-directory=/boot/efi --no-nvram"


def _grub(b: Build, esp: Path, kernels: tuple[str, ...], root_uuid: str, esp_uuid: str) -> str:
    """GRUB on the ESP's removable path (what OVMF boots with an empty NVRAM) and in
    EFI/debian (where an installed Debian has it), /boot/grub on the root fs."""
    default_grub(b)
    return (
        f"mount /boot/efi\n{EFI_INSTALL} --removable\n{EFI_INSTALL} --bootloader-id=debian\n"
        "update-grub\numount /boot/efi\n"
    )


def _grub_sb(b: Build, esp: Path, kernels: tuple[str, ...], root_uuid: str, esp_uuid: str) -> str:
    """A Secure Boot install as PVE 8.1+ makes one on ext4: `grub`, with grub-install putting
    Debian's signed shim and GRUB on the ESP (shimx64.efi as EFI/BOOT/BOOTX64.EFI beside the
    signed grubx64.efi; grub-install's --uefi-secure-boot, Debian's default where the signed
    packages are installed), and Debian's signed kernel pinned as the default the way
    proxmox-boot-tool pins one (/etc/default/grub.d/proxmox-kernel-pin.cfg): the -pve kernels
    beside it are the vm tier's own builds, unsigned, as gpuhost's are."""
    (signed,) = (k for k in kernels if not k.endswith("-pve"))
    entry = f"gnulinux-advanced-{root_uuid}>gnulinux-{signed}-advanced-{root_uuid}"
    b.write("/etc/default/grub.d/proxmox-kernel-pin.cfg", f'GRUB_DEFAULT="{entry}"\n')
    return _grub(b, esp, kernels, root_uuid, esp_uuid).replace(
        EFI_INSTALL, f"{EFI_INSTALL} --uefi-secure-boot"
    )


def _bios_lvm(b: Build, esp: Path, kernels: tuple[str, ...], root_uuid: str, esp_uuid: str) -> str:
    """A PVE ext4 install on legacy BIOS: GRUB's i386-pc core in the disk's BIOS boot partition,
    /boot/grub on the LVM root (docs/reference/trial-boot.md §0), where GRUB reads grubenv but
    cannot write it: `save_env` fails on an LVM (diskfilter) device."""
    default_grub(b)
    return "grub-install --target=i386-pc /dev/vda\nupdate-grub\n"


def _grub_esp(b: Build, esp: Path, kernels: tuple[str, ...], root_uuid: str, esp_uuid: str) -> str:
    """proxmox-boot-tool's `grub` mode (docs/reference/trial-boot.md §2.4): GRUB with --boot-directory on the
    ESP (<ESP>/grub/grub.cfg, grubenv), the kernels at the ESP's root, grub.cfg rendered by
    update-grub with the ESP bind-mounted on /boot, as zz-proxmox-boot does; and the root fs's
    own /boot/grub/grub.cfg, which a Proxmox install has too (never read at boot; Debian's
    zz-update-grub kernel hook keeps it current because it exists, and proxmox-boot-tool reads
    the GRUB entry id from it, functions L136-137)."""
    default_grub(b)
    copies = "".join(f"cp /boot/vmlinuz-{k} /boot/initrd.img-{k} /boot/efi/\n" for k in kernels)
    efi = f"{EFI_INSTALL} --boot-directory=/boot/efi"
    return (
        f"mount -t vfat UUID={esp_uuid} /boot/efi\n{copies}"
        f"{efi} --removable\n{efi} --bootloader-id=proxmox\n"
        "mount --bind /boot/efi /boot\nupdate-grub\numount /boot\n"
        "mkdir -p /boot/grub\nupdate-grub\numount /boot/efi\n"
    )


def _systemd_boot(
    b: Build, esp: Path, kernels: tuple[str, ...], root_uuid: str, esp_uuid: str
) -> str:
    """The ESP as `proxmox-boot-tool init` + `refresh` leave it (docs/reference/trial-boot.md §1.1)."""
    efi = b.root / "usr/lib/systemd/boot/efi/systemd-bootx64.efi"
    for dest in ("EFI/BOOT/BOOTX64.EFI", "EFI/systemd/systemd-bootx64.efi"):
        (esp / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(efi, esp / dest)
    (esp / "loader/entries").mkdir(parents=True)
    (esp / "loader/loader.conf").write_text("timeout 3\ndefault proxmox-*\n")
    options = (b.root / "etc/kernel/cmdline").read_text().splitlines()[0]
    for kver in kernels:
        kdir = esp / "EFI/proxmox" / kver
        kdir.mkdir(parents=True)
        for name in (f"vmlinuz-{kver}", f"initrd.img-{kver}"):
            shutil.copy(b.root / "boot" / name, kdir / name)
        (esp / f"loader/entries/proxmox-{kver}.conf").write_text(
            f"title    Proxmox Virtual Environment\nversion  {kver}\noptions  {options}\n"
            f"linux    /EFI/proxmox/{kver}/vmlinuz-{kver}\n"
            f"initrd   /EFI/proxmox/{kver}/initrd.img-{kver}\n"
        )
    return ""


LAYOUT_STEPS = {
    "grub": _grub,
    "grub-sb": _grub_sb,
    "grub-esp": _grub_esp,
    "bios-lvm": _bios_lvm,
    "systemd-boot": _systemd_boot,
}


def finish(b: Build) -> str:
    """Fresh host keys for this image, an empty machine-id (each VM makes its own on first
    boot), no package caches, services allowed again. Returns the ed25519 public host key."""
    for key in (b.root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    b.chroot("ssh-keygen", "-A")
    b.chroot("apt-get", "clean")
    (b.root / "etc/machine-id").write_text("")
    (b.root / "var/lib/dbus/machine-id").unlink(missing_ok=True)
    (b.root / "usr/sbin/policy-rc.d").unlink()
    pub = (b.root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
    return f"{pub[0]} {pub[1]}"


def client_key() -> Path:
    """The one client key pair every VM image authorises for root (made on first use)."""
    pub = Path(f"{CLIENT_KEY}.pub")
    if not pub.exists():
        CLIENT_KEY.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(CLIENT_KEY.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent workers make one pair, not two
            if not pub.exists():
                CLIENT_KEY.unlink(missing_ok=True)
                run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuhost-twin vm",
                     "-f", CLIENT_KEY])  # fmt: skip
    return CLIENT_KEY
