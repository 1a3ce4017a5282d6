"""What the twin's boot tools share (stdlib only): the files proxmox-kernel-helper keeps, the
collected output and exit of a simulated command, and the helpers of proxmox-boot/functions
(installed and kept kernels, the ESP list, UEFI or not)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .state import TWIN_STATE

ESP_LIST = "etc/kernel/proxmox-boot-uuids"


MANUAL_KERNEL_LIST = "etc/kernel/proxmox-boot-manual-kernels"


PINNED_KERNEL_CONF = "etc/kernel/proxmox-boot-pin"


NEXT_BOOT_PIN = "etc/kernel/next-boot-pin"


GRUB_PIN_SNIPPET = "etc/default/grub.d/proxmox-kernel-pin.cfg"


KERNEL_CMDLINE = "etc/kernel/cmdline"


BOOTCFG = f"{TWIN_STATE}/bootcfg.json"


ESP_STATE = f"{TWIN_STATE}/esp.json"  # what each ESP holds since the last refresh


TOOL = "/usr/sbin/proxmox-boot-tool"


HOOK = "/etc/kernel/postinst.d/zz-proxmox-boot"


@dataclass
class Out:
    """Collected output of one simulated command."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    rc: int = 0

    def out(self, line: str) -> None:
        self.stdout.append(line)

    def err(self, line: str) -> None:
        self.stderr.append(line)


class Exit(Exception):
    """Stop the simulated script with this exit status (set -e / exit N)."""

    def __init__(self, rc: int) -> None:
        super().__init__(rc)
        self.rc = rc


# --- helpers of proxmox-boot/functions ---


def version_key(version: str) -> list[tuple[int, int | str]]:
    """sort --version-sort, near enough for kernel versions."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.findall(r"\d+|[^\d]+", version)]


def first_line(root: Path, rel: str) -> str:
    try:
        text = (root / rel).read_text()
    except FileNotFoundError:
        return ""
    return text.split("\n", 1)[0]


def installed_kernels(root: Path) -> list[str]:
    """Versions with a /boot/vmlinuz-<ver>, newest first."""
    boot = root / "boot"
    found = (
        [p.name.removeprefix("vmlinuz-") for p in boot.glob("vmlinuz-*")] if boot.is_dir() else []
    )
    return sorted(found, key=version_key, reverse=True)


def running_kernel(root: Path) -> str:
    try:
        return (root / "proc/sys/kernel/osrelease").read_text().strip()
    except FileNotFoundError:
        pass
    try:
        m = re.match(r"Linux version (\S+)", (root / "proc/version").read_text())
    except FileNotFoundError:
        return ""
    return m.group(1) if m else ""


def kernel_keep_versions(root: Path, install_version: str = "") -> list[str]:
    """kernel_keep_versions: running, manual, latest two Proxmox kernels, pins; `sort -u`.

    The twin has no dpkg records of kernel packages, so 'installed Proxmox kernels' are the
    /boot/vmlinuz-*-pve files.
    """
    kernels = [install_version]  # the kernel a package hook was called for
    running = running_kernel(root).lower()
    if running and (root / f"boot/vmlinuz-{running}").exists():
        kernels.append(running)
    manual = root / MANUAL_KERNEL_LIST
    if manual.exists():
        kernels += manual.read_text().split("\n")
    kernels += [k for k in installed_kernels(root) if k.endswith("-pve")][:2]
    kernels += [first_line(root, PINNED_KERNEL_CONF), first_line(root, NEXT_BOOT_PIN)]
    return sorted({k for k in kernels if k})  # plain `sort -u`: lexical, like the tool


def boot_kernel_list(root: Path, install_version: str = "") -> list[str]:
    keep = kernel_keep_versions(root, install_version)
    return [k for k in keep if not re.fullmatch(r"\d+\.\d+", k)]


def esp_uuids(root: Path) -> list[str] | None:
    try:
        text = (root / ESP_LIST).read_text()
    except FileNotFoundError:
        return None
    return [line for line in text.split("\n") if line]


def booted_uefi(root: Path) -> bool:
    return (root / "sys/firmware/efi").is_dir()


def _load_esps(root: Path) -> dict[str, dict[str, object]]:
    try:
        return dict(json.loads((root / ESP_STATE).read_text()))
    except (FileNotFoundError, ValueError):
        return {}


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def initrd_record(root: Path, version: str) -> dict[str, object] | None:
    """The initramfs of a kernel as a record (ours are JSON; others just hashed)."""
    path = root / f"boot/initrd.img-{version}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
        if isinstance(record, dict):
            return record
    except ValueError:
        pass
    return {"sha256": hashlib.sha256(data).hexdigest()}
