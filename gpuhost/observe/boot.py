"""The boot path a trial boot depends on: firmware, boot loader variables, ESPs, grubenv, room.

One read-only command (nothing is mounted: ESPs stay as proxmox-boot-tool leaves them) whose
tagged lines a pure parser turns into :class:`BootPathInfo`. Every probe is guarded, so on a
machine without EFI, proxmox-boot-tool or GRUB the command prints less and still exits 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe

# systemd-boot's vendor GUID for the Boot Loader Interface variables.
LOADER_GUID = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
EFIVARS = "/sys/firmware/efi/efivars"
LOADER_VARIABLES = ("LoaderInfo", "LoaderEntryOneShot", "LoaderEntryDefault", "LoaderEntrySelected")
# What decides Secure Boot, as the kernel's EFI stub decides it before it locks itself down
# (drivers/firmware/efi/libstub/secureboot.c efi_get_secureboot, and secureboot.c of
# drivers/firmware/efi): SecureBoot 1 and SetupMode 0 in UEFI's global variables, unless shim's
# validation was turned off with mokutil (MokSBState 1; shim mirrors it to the runtime-readable
# MokSBStateRT, which is what `mokutil --sb-state` reads from a running system).
EFI_GLOBAL_GUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
SHIM_LOCK_GUID = "605dab50-e046-4300-abb6-3dd810dd8b23"
SECURE_BOOT_VARIABLES = {
    "SecureBoot": EFI_GLOBAL_GUID,
    "SetupMode": EFI_GLOBAL_GUID,
    "MokSBStateRT": SHIM_LOCK_GUID,
}
BOOT_UUIDS = "/etc/kernel/proxmox-boot-uuids"
BOOT_PIN = "/etc/kernel/proxmox-boot-pin"
NEXT_BOOT_PIN = "/etc/kernel/next-boot-pin"
GRUBENV = "/boot/grub/grubenv"
GRUB_CFG = "/boot/grub/grub.cfg"

# The devid in grub.cfg's "Advanced options" submenu id, extracted as proxmox-boot-tool does.
_DEVID_SED = r"s/.*gnulinux-advanced-(.+)['] \{$/\1/p"


@dataclass(frozen=True)
class BootPathInfo:
    """What the host shows about how it boots; ``known`` False: the fact was not captured."""

    known: bool = False
    uefi: bool = False
    efivars: dict[str, str] = field(default_factory=dict)  # Loader* name -> decoded string
    esp_uuids: tuple[str, ...] | None = None  # None: no /etc/kernel/proxmox-boot-uuids
    grub_source: str | None = None  # the block device under /boot/grub (findmnt SOURCE)
    grub_fstype: str | None = None
    grub_devid: str | None = None  # from /boot/grub/grub.cfg's gnulinux-advanced-<devid>
    grubenv: dict[str, str] | None = None  # None: no /boot/grub/grubenv or no grub-editenv
    pin: str | None = None  # /etc/kernel/proxmox-boot-pin, first line
    next_boot_pin: str | None = None  # /etc/kernel/next-boot-pin, first line
    boot_free: int | None = None  # bytes available on the file system holding /boot
    boot_size: int | None = None
    # bootctl on PATH (None: not read). It sets systemd-boot's one-shot, and comes from a package
    # that can be missing: systemd-boot on Debian 12; on Debian 13 systemd-boot-tools, while
    # pve8to9 asks for the systemd-boot meta-package to be removed (pve-manager
    # PVE/CLI/pve8to9.pm, check_bootloader).
    bootctl: bool | None = None
    # The first data byte of each SECURE_BOOT_VARIABLES variable the firmware has (absent: none)
    secure_boot_vars: dict[str, int] = field(default_factory=dict)

    @property
    def secure_boot(self) -> bool:
        """UEFI Secure Boot is in force: shim checks the kernel it is given and the kernel locks
        itself down (integrity: no unsigned module loads). False without UEFI or its variable."""
        sb = self.secure_boot_vars
        return (
            self.uefi
            and sb.get("SecureBoot") == 1
            and sb.get("SetupMode") != 1
            and sb.get("MokSBStateRT") != 1
        )

    @property
    def systemd_boot_started(self) -> bool:
        """systemd-boot started this boot: its LoaderInfo ("systemd-boot 252.39-1~deb12u2").
        Not just any LoaderInfo: GRUB 2.12 (Debian 13, loaded by /etc/grub.d/25_bli) sets one
        too ("GRUB 2.12", grub-core/commands/bli.c) but has no LoaderEntryOneShot."""
        return self.efivars.get("LoaderInfo", "").startswith("systemd-boot ")

    @property
    def grubenv_unwritable_by_grub(self) -> str | None:
        """Why GRUB cannot save_env to /boot/grub/grubenv (no one-shot there), else None."""
        source, fstype = self.grub_source or "", self.grub_fstype or ""
        if fstype in ("zfs", "btrfs"):
            return f"/boot/grub is on {fstype}, which GRUB cannot write"
        if source.startswith(("/dev/mapper/", "/dev/dm-")):
            return f"/boot/grub is on {source} (LVM or device-mapper), which GRUB cannot write"
        if source.startswith("/dev/md"):
            return f"/boot/grub is on {source} (software RAID), which GRUB cannot write"
        return None


def decode_efivar(hex_bytes: str) -> str:
    """An efivarfs file (4 attribute bytes, then UTF-16LE, maybe NUL-terminated) as text."""
    if len(hex_bytes) % 2 or not re.fullmatch(r"[0-9a-f]*", hex_bytes):
        raise ValueError(f"not hex bytes: {hex_bytes[:40]!r}")
    data = bytes.fromhex(hex_bytes)[4:]
    return data.decode("utf-16-le", errors="replace").split("\0", 1)[0]


def boot_path_command() -> str:
    reads = " ".join(LOADER_VARIABLES)
    sb_reads = " ".join(f"{name}-{guid}" for name, guid in SECURE_BOOT_VARIABLES.items())
    return "; ".join(
        [
            "if [ -d /sys/firmware/efi ]; then echo 'uefi yes'; else echo 'uefi no'; fi",
            f"for v in {reads}; do f={EFIVARS}/$v-{LOADER_GUID}; "
            '[ -r "$f" ] && echo "efivar $v $(od -An -tx1 -v "$f" | tr -d \' \\n\')"; done',
            f"for v in {sb_reads}; do f={EFIVARS}/$v; "
            '[ -r "$f" ] && echo "sbvar ${v%%-*} $(od -An -tx1 -v "$f" | tr -d \' \\n\')"; done',
            f"if [ -f {BOOT_UUIDS} ]; then echo esp-list; "
            f"grep -v '^[[:space:]]*$' {BOOT_UUIDS} | sed 's/^/esp /'; fi",
            "[ -e /boot/grub ] && findmnt -n -o SOURCE,FSTYPE -T /boot/grub 2>/dev/null "
            "| sed 's/^/grubfs /'",
            f'[ -f {GRUB_CFG} ] && sed -rn "{_DEVID_SED}" {GRUB_CFG} | head -n1 '
            "| sed 's/^/devid /'",
            f"[ -f {GRUBENV} ] && command -v grub-editenv >/dev/null 2>&1 && "
            f"{{ echo grubenv-list; grub-editenv {GRUBENV} list 2>/dev/null | sed 's/^/grubenv /'; }}",
            f'[ -f {BOOT_PIN} ] && echo "pin $(head -n1 {BOOT_PIN})"',
            f'[ -f {NEXT_BOOT_PIN} ] && echo "next-boot-pin $(head -n1 {NEXT_BOOT_PIN})"',
            "df -B1 --output=avail,size /boot 2>/dev/null | tail -n +2 | sed 's/^/boot-space /'",
            "if command -v bootctl >/dev/null 2>&1; then echo 'bootctl yes'; "
            "else echo 'bootctl no'; fi",
        ]
    )


def parse_boot_path(lines: list[str]) -> BootPathInfo:
    what = "boot path"
    values: dict = {"known": True, "efivars": {}}
    for line in lines:
        if not line.strip():
            continue
        tag, _, rest = line.partition(" ")
        rest = rest.strip()
        if tag in ("uefi", "bootctl") and rest in ("yes", "no"):
            values[tag] = rest == "yes"
        elif tag == "efivar":
            name, _, hex_bytes = rest.partition(" ")
            if name not in LOADER_VARIABLES:
                raise UnparsedOutput(what, line, "unknown EFI variable")
            try:
                values["efivars"][name] = decode_efivar(hex_bytes)
            except ValueError as exc:
                raise UnparsedOutput(what, line, str(exc)) from None
        elif tag == "sbvar":
            name, _, hex_bytes = rest.partition(" ")
            data = bytes.fromhex(hex_bytes) if re.fullmatch(r"(?:[0-9a-f]{2})*", hex_bytes) else b""
            if name not in SECURE_BOOT_VARIABLES or len(data) < 5:
                raise UnparsedOutput(what, line, "expected a Secure Boot variable and its bytes")
            values.setdefault("secure_boot_vars", {})[name] = data[4]  # after 4 attribute bytes
        elif tag == "esp-list":
            values["esp_uuids"] = ()
        elif tag == "esp" and "esp_uuids" in values:
            values["esp_uuids"] += (rest,)
        elif tag == "grubfs":
            source, _, fstype = rest.rpartition(" ")
            if not source:
                raise UnparsedOutput(what, line, "expected SOURCE FSTYPE")
            values["grub_source"], values["grub_fstype"] = source.strip(), fstype
        elif tag == "devid":
            values["grub_devid"] = rest
        elif tag == "grubenv-list":
            values["grubenv"] = {}
        elif tag == "grubenv" and "grubenv" in values:
            name, sep, value = rest.partition("=")
            if not sep:
                raise UnparsedOutput(what, line, "expected name=value")
            values["grubenv"][name] = value
        elif tag in ("pin", "next-boot-pin"):
            values[tag.replace("-", "_")] = rest or None
        elif tag == "boot-space":
            numbers = rest.split()
            if len(numbers) != 2 or not all(n.isdigit() for n in numbers):
                raise UnparsedOutput(what, line, "expected AVAIL SIZE in bytes")
            values["boot_free"], values["boot_size"] = (int(n) for n in numbers)
        else:
            raise UnparsedOutput(what, line)
    return BootPathInfo(**values)


class BootPath(Probe[BootPathInfo]):
    """
    Returns how the host boots, for planning a trial boot:
    ``BootPathInfo(uefi=True, efivars={"LoaderInfo": "systemd-boot 252.39-1~deb12u2"},
    esp_uuids=("4A1C-9E2B",), grub_source="rpool/ROOT/pve-1", grub_fstype="zfs", ...)``.
    """

    default = BootPathInfo

    def command(self) -> str:
        return boot_path_command()

    def process(self, output: list[str]) -> BootPathInfo:
        return parse_boot_path(output)
