"""Installing the simulated Proxmox layer into a twin root: /etc/pve, the shims, the kernel hooks
and the factory boot configuration (re-exported by the package as install and friends)."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from .boot_functions import Out, installed_kernels
from .bootloader import KERNEL_HOOKS
from .esp_sync import ensure_grubenv, refresh
from .grub import update_grub
from .initramfs import initramfs_record
from .state import TWIN_STATE

LIB = "usr/lib/gpuhost-twin"
SHIMS = {
    "pct": "usr/sbin",
    "qm": "usr/sbin",
    "pvesh": "usr/bin",
    "proxmox-boot-tool": "usr/sbin",
    "update-grub": "usr/sbin",
    "update-initramfs": "usr/sbin",
    "mkinitramfs": "usr/sbin",
    "pveversion": "usr/bin",
}
HOOK = '''#!/usr/bin/python3
"""/etc/kernel/{phase}.d/{name}: the gpuhost twin's kernel hook (source: twin/pve in gpuhost)."""
import os
import sys

sys.path.insert(0, os.path.join(os.environ.get("TWIN_ROOT", "/"), "{lib}"))
from pve.cli import main  # noqa: E402

sys.exit(main("kernel-hook", ["{phase}", "{name}", *sys.argv[1:]]))
'''
SHIM = '''#!/usr/bin/python3 -S
"""{tool}: the gpuhost twin's simulated Proxmox tool (source: twin/pve in gpuhost)."""
import os
import sys

sys.path.insert(0, os.path.join(os.environ.get("TWIN_ROOT", "/"), "{lib}"))
from pve.cli import main  # noqa: E402

sys.exit(main("{tool}"))
'''


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def install(root: Path, profile: Any = None, node: str | None = None) -> None:
    """Make `root` a Proxmox node: call after the kernels are in /boot (hardware.install).

    The node name is `node`, else the twin's /etc/hostname, else the profile's hostname.
    Existing files (a deploy's or a previous boot's) are never overwritten.
    """
    root = Path(root)
    hostname = root / "etc/hostname"
    if node is None and hostname.exists() and hostname.read_text().strip():
        node = hostname.read_text().split()[0].split(".")[0]
    node = node or _get(profile, "hostname") or socket.gethostname().split(".")[0]
    boot = _get(profile, "boot")
    loader = _get(boot, "loader") or (
        "systemd-boot" if (root / "etc/kernel/proxmox-boot-uuids").exists() else "grub"
    )
    firmware = _get(boot, "firmware") or ("uefi" if loader == "systemd-boot" else "bios")
    state = root / TWIN_STATE
    state.mkdir(parents=True, exist_ok=True)
    release = int(_get(profile, "pve", 8))
    info = {"node": node, "loader": loader, "firmware": firmware,
            "root_device": "/dev/mapper/pve-root", "pve": release,
            "grub_on_esp": bool(_get(boot, "grub_on_esp"))}  # fmt: skip
    (state / "pve.json").write_text(json.dumps(info, indent=1) + "\n")
    _layout_pve(root, node)
    # a profile made from a capture: the Proxmox packages at the captured versions, or none
    captured = _get(_get(profile, "start"), "packages")
    packages = RELEASE_PACKAGES[release] if captured is None else dict(captured)
    _register_packages(root, release, packages)
    _install_code(root, proxmox=bool(packages), grub=loader != "none")
    _install_kernel_hooks(root, loader)
    _factory_boot(root, boot, loader, firmware)


def _layout_pve(root: Path, node: str) -> None:
    """pmxcfs's shape: nodes/<node>/{lxc,qemu-server} and the lxc, qemu-server, local links."""
    pve = root / "etc/pve"
    nodedir = pve / "nodes" / node
    for sub in ("lxc", "qemu-server"):
        (nodedir / sub).mkdir(parents=True, exist_ok=True)
    (pve / "priv").mkdir(mode=0o700, parents=True, exist_ok=True)
    for link, target in (("lxc", f"nodes/{node}/lxc"), ("qemu-server", f"nodes/{node}/qemu-server"),
                         ("local", f"nodes/{node}")):  # fmt: skip
        path = pve / link
        if path.is_symlink():
            if os.readlink(path) == target:
                continue
            path.unlink()
        elif path.is_dir():  # someone wrote configs before the links existed: keep them
            for item in path.iterdir():
                shutil.move(str(item), str(pve / target / item.name))
            path.rmdir()
        path.symlink_to(target)


# The Proxmox packages whose versions a deploy reads (dpkg-query): pve-container's decides
# whether devN entries exist (5.0.7+). PVE 8 is stable-bookworm's (PVE 8.4), whose sources the
# simulation follows (docs/reference/pve-api.md); PVE 9 is a 9.0 host of September 2025, each version the
# debian/changelog entry of its own repository (pve-container 6.0.11 of 2025-09-10, qemu-server
# 9.0.21 of 2025-09-10, pve-manager 9.0.10 of 2025-09-12).
PACKAGES = {"pve-container": "5.3.5", "pve-manager": "8.4.1"}
RELEASE_PACKAGES = {
    8: PACKAGES,
    9: {"pve-container": "6.0.11", "qemu-server": "9.0.21", "pve-manager": "9.0.10"},
}


def _register_packages(
    root: Path, release: int = 8, packages: dict[str, str] | None = None
) -> None:
    """Record the simulated Proxmox packages (default: the release's) in dpkg's database, as
    installed (once)."""
    status = root / "var/lib/dpkg/status"
    if not status.is_file():
        return
    text = status.read_text()
    for package, version in (RELEASE_PACKAGES[release] if packages is None else packages).items():
        if f"\nPackage: {package}\n" in f"\n{text}":
            continue
        text = text.rstrip("\n") + (
            f"\n\nPackage: {package}\nStatus: install ok installed\nPriority: optional\n"
            "Section: perl\nInstalled-Size: 1\nMaintainer: Proxmox Support Team "
            f"<support@proxmox.com>\nArchitecture: all\nVersion: {version}\n"
            "Description: gpuhost twin stand-in for the Proxmox package of this name\n"
        )
    status.write_text(text if text.endswith("\n") else text + "\n")


# The tools of Proxmox's own packages (pve-container, qemu-server, pve-manager,
# proxmox-kernel-helper): a twin made from a capture without Proxmox has none of them; the
# twin's own code calls the simulation in-process, not through these.
PROXMOX_TOOLS = ("pct", "qm", "pvesh", "proxmox-boot-tool", "pveversion")


def _install_code(root: Path, proxmox: bool = True, grub: bool = True) -> None:
    from twin import bytecode  # outside the twin only: this package runs inside it too

    bytecode.copy_package(Path(__file__).parent, root / LIB / "pve", copy=shutil.copy)
    for tool, where in SHIMS.items():
        if tool in PROXMOX_TOOLS and not proxmox:
            continue
        if tool == "update-grub" and not grub:  # grub2-common's: a machine without a loader
            continue
        target = root / where / tool
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.write_text(SHIM.format(tool=tool, lib=LIB))
        target.chmod(0o755)


def _install_kernel_hooks(root: Path, loader: str) -> None:
    """What initramfs-tools, proxmox-kernel-helper (and grub2 on GRUB hosts) put in
    /etc/kernel/{postinst,postrm}.d: a kernel package install builds its initrd and syncs."""
    for phase, names in KERNEL_HOOKS.items():
        for name in names:
            if name == "zz-update-grub" and loader != "grub":
                continue
            target = root / "etc/kernel" / f"{phase}.d" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(HOOK.format(phase=phase, name=name, lib=LIB))
            target.chmod(0o755)


def _factory_boot(root: Path, boot: Any, loader: str, firmware: str) -> None:
    """What the Proxmox installer leaves: ESP list + cmdline or /etc/default/grub, initrds,
    and one refresh/update-grub so the first boot has a bootloader configuration."""
    if firmware == "uefi":
        (root / "sys/firmware/efi").mkdir(parents=True, exist_ok=True)
    on_esp = loader == "systemd-boot" or bool(_get(boot, "grub_on_esp"))
    if on_esp:
        uuids = root / "etc/kernel/proxmox-boot-uuids"
        uuids.parent.mkdir(parents=True, exist_ok=True)
        if not uuids.exists():
            uuids.write_text("".join(f"{u}\n" for u in _get(boot, "esp_uuids") or ["9B1C-4F2A"]))
    if loader == "systemd-boot":
        cmdline = root / "etc/kernel/cmdline"
        if not cmdline.exists():
            cmdline.write_text(
                (_get(boot, "kernel_cmdline") or "root=ZFS=rpool/ROOT/pve-1 boot=zfs") + "\n"
            )
    elif loader == "grub":  # loader none (profile_boot.py): the hypervisor's, nothing here
        default = root / "etc/default/grub"
        default.parent.mkdir(parents=True, exist_ok=True)
        (root / "etc/default/grub.d").mkdir(exist_ok=True)
        if not default.exists():
            default.write_text(_get(boot, "default_grub") or PVE_DEFAULT_GRUB)
    for version in installed_kernels(root):
        initrd = root / f"boot/initrd.img-{version}"
        if not initrd.exists():
            initrd.write_text(json.dumps(initramfs_record(root, version), indent=1) + "\n")
    out = Out()
    if loader == "grub":
        update_grub(root, out)  # /boot/grub/grub.cfg, where proxmox-boot-tool reads the devid
        if not on_esp:
            ensure_grubenv(root / "boot/grub/grubenv")  # grub-install makes an empty one
    if on_esp:
        refresh(root, out)


PVE_DEFAULT_GRUB = """\
# If you change this file, run 'update-grub' afterwards to update
# /boot/grub/grub.cfg.
# For full documentation of the options in this file, see:
#   info -f grub -n 'Simple configuration'

GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR="Proxmox VE"
GRUB_CMDLINE_LINUX_DEFAULT="quiet"
GRUB_CMDLINE_LINUX=""
"""
