"""proxmox-kernel-helper's shared functions and its zz-proxmox-boot kernel hook, for gpuhost's
stand-in proxmox-boot-tool (proxmox_boot_tool.py; stdlib only): which kernels are kept, the
pins, and syncing the kernels onto each ESP as 8.1.0's src/proxmox-boot/{functions,
zz-proxmox-boot} do, on real disks: the ESP mounted in a private mount namespace, the files
copied, loader.conf's default or GRUB's pin snippet written, and Debian's real update-grub run
with the ESP bind-mounted on /boot."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TOOL = "/usr/sbin/proxmox-boot-tool"
ESP_LIST = Path("/etc/kernel/proxmox-boot-uuids")
MANUAL_KERNEL_LIST = Path("/etc/kernel/proxmox-boot-manual-kernels")
PINNED_KERNEL_CONF = Path("/etc/kernel/proxmox-boot-pin")
NEXT_BOOT_PIN = Path("/etc/kernel/next-boot-pin")
GRUB_PIN_SNIPPET = Path("/etc/default/grub.d/proxmox-kernel-pin.cfg")
MOUNTROOT = Path(os.environ.get("TMPDIR", "/var/tmp")) / "espmounts"
PMX_ESP_DIR = "EFI/proxmox"
PMX_LOADER_CONF = "loader/loader.conf"
LOADER_TITLE = "Proxmox Virtual Environment"
VFAT_UUID = re.compile(r"[0-9a-fA-F]{4}-[0-9a-fA-F]{4}")
HOOKSCRIPTS = ("proxmox-auto-removal", "zz-proxmox-boot")


class Exit(Exception):
    def __init__(self, rc: int) -> None:
        super().__init__(rc)
        self.rc = rc


def warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def say(line: str) -> None:
    print(line, flush=True)


def first_line(path: Path) -> str:
    try:
        return path.read_text().split("\n", 1)[0]
    except FileNotFoundError:
        return ""


def run(*argv: str) -> None:
    if subprocess.run(argv).returncode != 0:  # the shell script runs under `set -e`
        raise Exit(1)


def version_sort_key(version: str) -> list[tuple[int, int | str]]:
    """`sort --version-sort`, near enough for kernel versions."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.findall(r"\d+|\D+", version)]


# --- functions ---------------------------------------------------------------------------------


def kernel_keep_versions(install_version: str = "") -> list[str]:
    """The running kernel, the one being installed, the manual list, the two newest
    proxmox-kernel-*/pve-kernel-* packages dpkg has (only those names: a linux-image-*-pve
    kernel is kept only while it runs, is listed or pinned), the newest of the previous series,
    and the pins; `sort -u`."""
    listed = subprocess.run(["dpkg", "-l"], capture_output=True, text=True).stdout
    names = []
    for line in listed.splitlines():
        fields = line.split()
        if len(fields) < 2 or not re.match(r"[ih][^nc]$", fields[0]):
            continue
        m = re.fullmatch(r"(?:proxmox|pve)-kernel-(\d+\..+?)(?:-signed)?(?::\S+)?", fields[1])
        if m and not re.search(r"-dbg(sym)?$", m.group(1)):
            names.append(m.group(1))
    ordered = sorted(set(names), key=version_sort_key, reverse=True)
    latest_2 = [v for v in ordered if re.match(r"[^ ]+-pve", v)][:2]
    series = [v for v in ordered if not re.match(r"[^ ]+-pve", v)][:2]
    old_series = series[-1] if series else ""
    old_latest = [v for v in ordered if old_series and v.startswith(f"{old_series}.")][:1]
    running = os.uname().release.lower()
    if not Path(f"/boot/vmlinuz-{running}").exists():
        running = ""
    manual = MANUAL_KERNEL_LIST.read_text().split("\n") if MANUAL_KERNEL_LIST.exists() else []
    kernels = [running, install_version, *manual, *latest_2, *series, *old_latest]
    kernels += [first_line(PINNED_KERNEL_CONF), first_line(NEXT_BOOT_PIN)]
    return sorted({k for k in kernels if k})  # plain `sort -u`


def boot_kernel_list(install_version: str = "") -> list[str]:
    return [k for k in kernel_keep_versions(install_version) if not re.fullmatch(r"\d+\.\d+", k)]


def esp_uuids() -> list[str] | None:
    if not ESP_LIST.exists():
        return None
    return [u for u in ESP_LIST.read_text().split("\n") if u]


def reexec_in_mountns() -> None:
    """Mount the ESPs where nobody else sees them, as the real tool does."""
    if not os.environ.get("PVE_EFIBOOT_UNSHARED"):
        os.environ["PVE_EFIBOOT_UNSHARED"] = "1"
        say(f"Re-executing '{sys.argv[0]}' in new private mount namespace..")
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", *sys.argv])
        raise Exit(done.returncode)  # `set -e`: the child's status is the tool's


def set_grub_default(kver: str) -> None:
    if not kver:
        GRUB_PIN_SNIPPET.unlink(missing_ok=True)
        return
    # GRUB's entry ids carry the root device's id; proxmox-boot-tool takes it from the root
    # file system's /boot/grub/grub.cfg
    cfg = Path("/boot/grub/grub.cfg")
    found = re.findall(r".*gnulinux-advanced-(.+)['] \{$", cfg.read_text(), re.M)
    devid = found[-1] if found else ""
    entry = f"gnulinux-advanced-{devid}>gnulinux-{kver}-advanced-{devid}"
    GRUB_PIN_SNIPPET.parent.mkdir(parents=True, exist_ok=True)
    GRUB_PIN_SNIPPET.write_text(f'GRUB_DEFAULT="{entry}"\n')


def set_systemd_boot_default(esp: Path, kver: str) -> None:
    entry = f"proxmox-{kver}.conf" if kver else "proxmox-*"
    conf = esp / PMX_LOADER_CONF
    lines = conf.read_text().splitlines()
    if any(line.startswith("default ") for line in lines):
        lines = [f"default {entry}" if line.startswith("default ") else line for line in lines]
    else:
        lines.append(f"default {entry}")
    conf.write_text("".join(f"{line}\n" for line in lines))


# --- zz-proxmox-boot ---------------------------------------------------------------------------


def update_esps(kernels: list[str]) -> None:
    uuids = esp_uuids()
    if uuids is None:
        warn(f"No {ESP_LIST} found, skipping ESP sync.")
        return
    if Path("/etc/kernel/cmdline").exists():
        cmdline = " ".join(first_line(Path("/etc/kernel/cmdline")).split())
        if "root=" not in cmdline:
            warn("No root= parameter in /etc/kernel/cmdline found!")
            raise Exit(1)
    else:
        warn("No /etc/kernel/cmdline found - falling back to /proc/cmdline")
        proc = Path("/proc/cmdline").read_text()
        cmdline = " ".join(re.sub(r"\binitrd=[0-9a-zA-Z\\/.-]*\s*", "", proc).split())
    for uuid in uuids:
        _update_esp(uuid, kernels, cmdline)


def _mount(uuid: str) -> Path | None:
    if not VFAT_UUID.search(uuid):
        warn(f"WARN: {uuid} read from {ESP_LIST} does not look like a VFAT-UUID - skipping")
        return None
    path = Path(f"/dev/disk/by-uuid/{uuid}")
    if not path.exists():
        warn(f"WARN: {path} does not exist - clean '{ESP_LIST}'! - skipping")
        return None
    mountpoint = MOUNTROOT / uuid
    mountpoint.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", str(path), str(mountpoint)]).returncode != 0:
        warn(f"mount of {path} failed - skipping")
        return None
    return mountpoint


def _umount(mountpoint: Path) -> None:
    if subprocess.run(["umount", str(mountpoint)]).returncode != 0:
        warn(f"umount of {mountpoint} failed - failure")
        raise Exit(0)
    with contextlib.suppress(OSError):  # `rmdir ... || true`
        mountpoint.rmdir()


def _update_esp(uuid: str, kernels: list[str], cmdline: str) -> None:
    esp = _mount(uuid)
    if esp is None:
        return
    path = f"/dev/disk/by-uuid/{uuid}"
    grub = (esp / "EFI/proxmox/grubx64.efi").exists()
    efi = Path("/sys/firmware/efi").is_dir()
    if efi and not grub:
        if not (esp / PMX_LOADER_CONF).is_file():
            warn(f"{path} contains no loader.conf - skipping")
            return
        if not (esp / PMX_ESP_DIR).is_dir():
            warn(f"{path}/{PMX_ESP_DIR} does not exist- skipping")
            return
    elif not (esp / "grub").is_dir():
        warn(f"{path} contains no grub directory - skipping")
        return
    warn(f"Copying and configuring kernels on {path}")
    for kver in kernels:
        image, initrd = Path(f"/boot/vmlinuz-{kver}"), Path(f"/boot/initrd.img-{kver}")
        if not image.is_file():
            warn(f"No linux-image {image} found - skipping")
            continue
        if not initrd.is_file():
            warn(f"No initrd-image {initrd} found - skipping")
            continue
        if efi and not grub:
            warn(f"\tCopying kernel and creating boot-entry for {kver}")
            live = esp / PMX_ESP_DIR / kver
            live.mkdir(parents=True, exist_ok=True)
            shutil.copy2(image, live)
            shutil.copy2(initrd, live)
            (esp / f"loader/entries/proxmox-{kver}.conf").write_text(
                f"title    {LOADER_TITLE}\nversion  {kver}\noptions  {cmdline}\n"
                f"linux    /{PMX_ESP_DIR}/{kver}/vmlinuz-{kver}\n"
                f"initrd   /{PMX_ESP_DIR}/{kver}/initrd.img-{kver}\n"
            )
        else:
            warn(f"\tCopying kernel {kver}")
            shutil.copy2(image, esp)
            shutil.copy2(initrd, esp)
    pinned = first_line(PINNED_KERNEL_CONF)
    if NEXT_BOOT_PIN.exists():
        pinned = first_line(NEXT_BOOT_PIN)
    keep = "\n".join(kernels)
    if efi and not grub:
        set_systemd_boot_default(esp, pinned)
        for kerneldir in sorted((esp / PMX_ESP_DIR).iterdir()):
            if not kerneldir.is_dir():
                warn(f"\t{kerneldir} is not a directory - skipping")
                continue
            if kerneldir.name in keep:  # `grep -q` of the list: a substring is enough
                continue
            warn(f"\tRemoving old version {kerneldir.name}")
            shutil.rmtree(kerneldir)
            (esp / f"loader/entries/proxmox-{kerneldir.name}.conf").unlink(missing_ok=True)
    else:
        set_grub_default(pinned)
        for image in sorted(esp.glob("vmlinuz-*")):
            kver = image.name.removeprefix("vmlinuz-")
            if kver in keep:
                continue
            warn(f"\tRemoving old version {kver}")
            image.unlink(missing_ok=True)
            (esp / f"initrd.img-{kver}").unlink(missing_ok=True)
        run("mount", "--bind", str(esp), "/boot")
        try:
            run("update-grub")
        finally:
            run("umount", "/boot")
    _umount(esp)


def kernel_hook(argv: list[str]) -> None:
    """/etc/kernel/post{inst,rm}.d/zz-proxmox-boot: only on postinst configure and postrm
    remove (or without DEB_MAINT_PARAMS), as the real hook."""
    params = os.environ.get("DEB_MAINT_PARAMS", "").split()
    mode = params[0].strip("'") if params else ""
    phase = "postinst" if "/postinst.d/" in argv[0] else "postrm"
    if mode not in ("", "configure" if phase == "postinst" else "remove"):
        return
    reexec_in_mountns()
    install = argv[1] if phase == "postinst" and len(argv) > 1 else ""
    update_esps(boot_kernel_list(install))
