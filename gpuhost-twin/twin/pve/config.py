"""Guest config files under /etc/pve, read and written the way Proxmox does (stdlib only).

Sources (formats.md §1, §3): pve-container PVE::LXC::Config parse_pct_config / write_pct_config /
check_type / $confdesc / $valid_lxc_conf_keys, qemu-server PVE::QemuServer parse_vm_config /
write_vm_config, PVE::QemuServer::PCI $hostpci_fmt, PVE::QemuServer::Machine $machine_fmt,
pve-common PVE::Tools encode_text/decode_text.

All paths take `root`, the twin's root directory ("/" inside the twin).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import stat
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from .schema import (
    STARTUP_FMT,
    FormatError,
    Prop,
    PveError,
    accept_any,
    check_format,
    parse_boolean,
    parse_property_string,
    verify_configid,
    verify_disk_size,
    verify_dns_name,
    verify_lxc_dev_string,
    verify_lxc_mp_string,
    verify_tag_list,
    verify_volume_id,
)

TWIN_STATE = "var/lib/gpuhost-twin"  # the twin's own bookkeeping, relative to root


def _bool(**kw: object) -> Prop:
    return Prop(type="boolean", **kw)  # type: ignore[arg-type]


def _int(**kw: object) -> Prop:
    return Prop(type="integer", **kw)  # type: ignore[arg-type]


# --- container options (pve-container $confdesc, master branch; see README note on PVE 8) ---

_MOUNT_OPT = r"(discard|lazytime|noatime|nodev|noexec|nosuid)"
ROOTFS_FMT: dict[str, Prop] = {
    "volume": Prop(optional=False, default_key=True, format=verify_lxc_mp_string),
    "size": Prop(format=verify_disk_size),
    "acl": _bool(),
    "mountoptions": Prop(pattern=rf"{_MOUNT_OPT}(;{_MOUNT_OPT})*"),
    "ro": _bool(),
    "quota": _bool(),
    "replicate": _bool(),
    "shared": _bool(),
}
MP_FMT: dict[str, Prop] = {
    **ROOTFS_FMT,
    "backup": _bool(),
    "mp": Prop(optional=False, format=verify_lxc_mp_string),
}
DEV_FMT: dict[str, Prop] = {
    "path": Prop(default_key=True, format=verify_lxc_dev_string),
    "mode": Prop(pattern=r"0[0-7]{3}"),
    "uid": _int(minimum=0),
    "gid": _int(minimum=0),
    "deny-write": _bool(),
}
LXC_NET_FMT: dict[str, Prop] = {
    "type": Prop(enum=("veth",)),
    "name": Prop(optional=False, pattern=r"[-_.\w\d]+"),
    "bridge": Prop(pattern=r"[-_.\w\d]+"),
    "hwaddr": Prop(format=accept_any),
    "mtu": _int(minimum=64, maximum=65535),
    "ip": Prop(format=accept_any),
    "gw": Prop(format=accept_any),
    "ip6": Prop(format=accept_any),
    "gw6": Prop(format=accept_any),
    "firewall": _bool(),
    "tag": _int(minimum=1, maximum=4094),
    "trunks": Prop(pattern=r"\d+(?:;\d+)*"),
    "rate": Prop(type="number"),
    "link_down": _bool(),
}
FEATURES_FMT: dict[str, Prop] = {
    "mount": Prop(pattern=r"[a-zA-Z0-9_; ]+"),
    "nesting": _bool(),
    "keyctl": _bool(),
    "fuse": _bool(),
    "mknod": _bool(),
    "force_rw_sys": _bool(),
}
UNUSED_FMT: dict[str, Prop] = {
    "volume": Prop(optional=False, default_key=True, format=verify_volume_id),
}

LXC_OPTIONS: dict[str, Prop] = {
    "lock": Prop(
        enum=tuple(
            "backup create destroyed disk fstrim migrate mounted rollback snapshot "
            "snapshot-delete".split()
        )
    ),
    "onboot": _bool(),
    "startup": Prop(format=STARTUP_FMT),
    "template": _bool(),
    "arch": Prop(enum=("amd64", "i386", "arm64", "armhf", "riscv32", "riscv64")),
    "ostype": Prop(
        enum=tuple(
            "debian devuan ubuntu centos fedora opensuse archlinux alpine gentoo nixos "
            "unmanaged".split()
        )
    ),
    "console": _bool(),
    "tty": _int(minimum=0, maximum=6),
    "cores": _int(minimum=1, maximum=8192),
    "cpulimit": Prop(type="number", minimum=0, maximum=8192),
    "cpuunits": _int(minimum=0, maximum=500000),
    "memory": _int(minimum=16),
    "swap": _int(minimum=0),
    "hostname": Prop(format=verify_dns_name, max_length=255),
    "description": Prop(max_length=8192),
    "ipmanagehost": _bool(),
    "searchdomain": Prop(format=accept_any),
    "nameserver": Prop(format=accept_any),
    "timezone": Prop(format=accept_any),
    "rootfs": Prop(format=ROOTFS_FMT),
    "parent": Prop(format=verify_configid, max_length=40),
    "snaptime": _int(minimum=0),
    "cmode": Prop(enum=("shell", "console", "tty")),
    "entrypoint": Prop(),
    "protection": _bool(),
    "unprivileged": _bool(),
    "features": Prop(format=FEATURES_FMT),
    "hookscript": Prop(format=verify_volume_id),
    "tags": Prop(format=verify_tag_list),
    "debug": _bool(),
}
LXC_OPTIONS.update({f"net{i}": Prop(format=LXC_NET_FMT) for i in range(32)})
LXC_OPTIONS.update({f"mp{i}": Prop(format=MP_FMT) for i in range(256)})
LXC_OPTIONS.update({f"unused{i}": Prop(format=UNUSED_FMT) for i in range(256)})
LXC_OPTIONS.update({f"dev{i}": Prop(format=DEV_FMT) for i in range(256)})

VALID_LXC_KEYS: dict[str, str | None] = {
    key: None
    for key in (
        "lxc.apparmor.profile lxc.apparmor.allow_incomplete lxc.apparmor.allow_nesting "
        "lxc.apparmor.raw lxc.selinux.context lxc.include lxc.arch lxc.uts.name "
        "lxc.signal.halt lxc.signal.reboot lxc.signal.stop lxc.init.cmd lxc.init.cwd "
        "lxc.pty.max lxc.console.logfile lxc.console.path lxc.tty.max lxc.devtty.dir "
        "lxc.hook.autodev lxc.autodev lxc.kmsg lxc.mount.fstab lxc.mount.entry lxc.mount.auto "
        "lxc.rootfs.mount lxc.cap.drop lxc.cap.keep lxc.seccomp.profile "
        "lxc.seccomp.notify.proxy lxc.seccomp.notify.cookie lxc.idmap lxc.hook.pre-start "
        "lxc.hook.pre-mount lxc.hook.mount lxc.hook.start lxc.hook.stop lxc.hook.post-stop "
        "lxc.hook.clone lxc.hook.destroy lxc.hook.version lxc.log.level lxc.log.file "
        "lxc.start.auto lxc.start.delay lxc.start.order lxc.group lxc.environment "
        "lxc.environment.runtime lxc.environment.hooks lxc.sysctl.fs.mqueue "
        "lxc.sysctl.kernel.msgmax lxc.sysctl.kernel.msgmnb lxc.sysctl.kernel.msgmni "
        "lxc.sysctl.kernel.sem lxc.sysctl.kernel.shmall lxc.sysctl.kernel.shmmax "
        "lxc.sysctl.kernel.shmmni lxc.sysctl.kernel.shm_rmid_forced"
    ).split()
}
VALID_LXC_KEYS["lxc.rootfs.path"] = "lxc.rootfs.path is auto generated from rootfs"
VALID_LXC_KEYS["lxc.rootfs.options"] = (
    'lxc.rootfs.options is not supported, please use mount point options in the "rootfs" key'
)
DEPRECATED_LXC_KEYS: dict[str, str] = {
    "lxc.aa_profile": "lxc.apparmor.profile",
    "lxc.aa_allow_incomplete": "lxc.apparmor.allow_incomplete",
    "lxc.console": "lxc.console.path",
    "lxc.devttydir": "lxc.tty.dir",
    "lxc.haltsignal": "lxc.signal.halt",
    "lxc.rebootsignal": "lxc.signal.reboot",
    "lxc.stopsignal": "lxc.signal.stop",
    "lxc.id_map": "lxc.idmap",
    "lxc.init_cmd": "lxc.init.cmd",
    "lxc.loglevel": "lxc.log.level",
    "lxc.logfile": "lxc.log.file",
    "lxc.mount": "lxc.mount.fstab",
    "lxc.network.type": "lxc.net.INDEX.type",
    "lxc.network.link": "lxc.net.INDEX.link",
    "lxc.pts": "lxc.pty.max",
    "lxc.seccomp": "lxc.seccomp.profile",
    "lxc.tty": "lxc.tty.max",
    "lxc.utsname": "lxc.uts.name",
}

# --- VM options (qemu-server $confdesc, PVE 8; only GPU-relevant formats are checked) ---

_PCIRE = r"(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"
_HEXID = r"^0x[0-9a-fA-F]{4}$"
HOSTPCI_FMT: dict[str, Prop] = {
    "host": Prop(default_key=True, pattern=rf"{_PCIRE}(;{_PCIRE})*"),
    "mapping": Prop(format=verify_configid),
    "rombar": _bool(),
    "romfile": Prop(pattern=r"[^,;]+"),
    "pcie": _bool(),
    "x-vga": _bool(),
    "legacy-igd": _bool(),
    "mdev": Prop(pattern=r"[^/\.:]+"),
    "vendor-id": Prop(pattern=_HEXID),
    "device-id": Prop(pattern=_HEXID),
    "sub-vendor-id": Prop(pattern=_HEXID),
    "sub-device-id": Prop(pattern=_HEXID),
}
MACHINE_FMT: dict[str, Prop] = {
    "type": Prop(
        default_key=True,
        max_length=40,
        pattern=r"(pc|pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?|q35|pc-q35-\d+(\.\d+)+"
        r"(\+pve\d+)?(\.pxe)?|virt(?:-\d+(\.\d+)+)?(\+pve\d+)?)",
    ),
    "viommu": Prop(enum=("intel", "virtio")),
}
MEMORY_FMT: dict[str, Prop] = {"current": _int(default_key=True, minimum=16)}

QEMU_OPTIONS: dict[str, Prop] = {
    "acpi": _bool(),
    "affinity": Prop(),
    "agent": Prop(),
    "amd-sev": Prop(),
    "arch": Prop(enum=("x86_64", "aarch64")),
    "args": Prop(),
    "audio0": Prop(),
    "autostart": _bool(),
    "balloon": _int(minimum=0),
    "bios": Prop(enum=("seabios", "ovmf")),
    "boot": Prop(),
    "bootdisk": Prop(),
    "cdrom": Prop(),
    "cicustom": Prop(),
    "cipassword": Prop(),
    "citype": Prop(enum=("configdrive2", "nocloud", "opennebula")),
    "ciupgrade": _bool(),
    "ciuser": Prop(),
    "cores": _int(minimum=1),
    "cpu": Prop(),
    "cpulimit": Prop(type="number", minimum=0, maximum=128),
    "cpuunits": _int(minimum=1, maximum=262144),
    "description": Prop(max_length=8192),
    "efidisk0": Prop(),
    "freeze": _bool(),
    "hookscript": Prop(format=verify_volume_id),
    "hotplug": Prop(),
    "hugepages": Prop(enum=("any", "2", "1024")),
    "ivshmem": Prop(),
    "keephugepages": _bool(),
    "keyboard": Prop(),
    "kvm": _bool(),
    "localtime": _bool(),
    "lock": Prop(
        enum=tuple(
            "backup clone create migrate rollback snapshot snapshot-delete suspending "
            "suspended".split()
        )
    ),
    "machine": Prop(format=MACHINE_FMT),
    "memory": Prop(format=MEMORY_FMT),
    "migrate_downtime": Prop(type="number", minimum=0),
    "migrate_speed": _int(minimum=0),
    "name": Prop(format=verify_dns_name),
    "nameserver": Prop(),
    "numa": _bool(),
    "onboot": _bool(),
    "ostype": Prop(
        enum=tuple("other wxp w2k w2k3 w2k8 wvista win7 win8 win10 win11 l24 l26 solaris".split())
    ),
    "protection": _bool(),
    "reboot": _bool(),
    "rng0": Prop(),
    "scsihw": Prop(
        enum=tuple("lsi lsi53c810 virtio-scsi-pci virtio-scsi-single megasas pvscsi".split())
    ),
    "searchdomain": Prop(),
    "shares": _int(minimum=0, maximum=50000),
    "smbios1": Prop(),
    "smp": _int(minimum=1),
    "sockets": _int(minimum=1),
    "spice_enhancements": Prop(),
    "sshkeys": Prop(),
    "startdate": Prop(),
    "startup": Prop(format=STARTUP_FMT),
    "tablet": _bool(),
    "tags": Prop(format=verify_tag_list),
    "tdf": _bool(),
    "template": _bool(),
    "tpmstate0": Prop(),
    "vcpus": _int(minimum=1),
    "vga": Prop(),
    "vmgenid": Prop(),
    "vmstate": Prop(format=verify_volume_id),
    "vmstatestorage": Prop(),
    "watchdog": Prop(),
    "meta": Prop(),
    "runningmachine": Prop(),
    "runningcpu": Prop(),
    "parent": Prop(format=verify_configid, max_length=40),
    "snaptime": _int(minimum=0),
}
for _prefix, _count in (
    ("hostpci", 16), ("ide", 4), ("sata", 6), ("scsi", 31), ("virtio", 16), ("net", 32),
    ("ipconfig", 32), ("numa", 8), ("serial", 4), ("parallel", 3), ("usb", 30),
    ("unused", 256), ("virtiofs", 10),
):  # fmt: skip
    for _i in range(_count):
        QEMU_OPTIONS[f"{_prefix}{_i}"] = (
            Prop(format=HOSTPCI_FMT) if _prefix == "hostpci" else Prop()
        )

SNAPSHOT_ONLY = ("parent", "snaptime")  # in $confdesc, but not settable through the API


# --- text encoding (PVE::Tools) ---


def encode_text(text: str) -> str:
    """PVE::Tools::encode_text: escape control/high-bit characters and ':'."""
    return urllib.parse.quote(text, safe="".join(chr(c) for c in range(0x20, 0x7F) if c != 0x3A))


def decode_text(data: str) -> str:
    return urllib.parse.unquote(data)


def perl_split_lines(text: str) -> list[str]:
    """perl split(/\\n/, $text): trailing empty fields are dropped."""
    parts = text.split("\n")
    while parts and parts[-1] == "":
        parts.pop()
    return parts


# --- data model ---


@dataclass
class Section:
    """One section of a guest config: the main part, [pve:pending]/[PENDING] or a snapshot."""

    values: dict[str, str] = field(default_factory=dict)
    lxc: list[tuple[str, str]] = field(default_factory=list)  # raw lxc.* keys, file order
    description: str | None = None


@dataclass
class GuestConfig:
    kind: str  # "lxc" or "qemu"
    vmid: int
    main: Section = field(default_factory=Section)
    pending: Section = field(default_factory=Section)
    snapshots: dict[str, Section] = field(default_factory=dict)
    cloudinit: Section = field(default_factory=Section)
    digest: str = ""
    warnings: list[str] = field(default_factory=list)

    def options(self) -> dict[str, Prop]:
        return LXC_OPTIONS if self.kind == "lxc" else QEMU_OPTIONS

    def current(self, with_pending: bool) -> dict[str, str]:
        """AbstractConfig::load_current_config: values, pending merged unless `current`."""
        values = dict(self.main.values)
        if self.main.description is not None:
            values["description"] = self.main.description
        if with_pending:
            for key, value in self.pending.values.items():
                if key != "delete":
                    values[key] = value
            if self.pending.description is not None:
                values["description"] = self.pending.description
            for key in pending_delete(self):
                values.pop(key, None)
        return values


def pending_delete(conf: GuestConfig) -> dict[str, bool]:
    """parse_pending_delete: {key: force} in file order ('!key' means force)."""
    res: dict[str, bool] = {}
    for item in re.split(r"[,;\s]+", conf.pending.values.get("delete", "").strip()):
        if item:
            res[item.lstrip("!")] = item.startswith("!")
    return res


def set_pending_delete(conf: GuestConfig, keys: dict[str, bool]) -> None:
    if keys:
        conf.pending.values["delete"] = ",".join(
            ("!" if force else "") + key for key, force in keys.items()
        )
    else:
        conf.pending.values.pop("delete", None)


# --- value checks used by the file parser (Config.pm / QemuServer.pm check_type) ---


def check_type(options: dict[str, Prop], key: str, value: str) -> str:
    """Normalise one config value or raise FormatError with Proxmox's text."""
    prop = options.get(key)
    if prop is None:
        raise FormatError(f"unknown setting '{key}'")
    if re.search(r"[\n\r]", value):
        raise FormatError("property contains a line feed")
    if prop.type == "boolean":
        parsed = parse_boolean(value)
        if parsed is None:
            raise FormatError(f"type check ('boolean') failed - got '{value}'")
        return str(parsed)
    if prop.type == "integer":
        if not re.fullmatch(r"\d+", value):
            raise FormatError(f"type check ('integer') failed - got '{value}'")
        return str(int(value))
    if prop.type == "number":
        if not re.fullmatch(r"(\d+)(\.\d+)?", value):
            raise FormatError(f"type check ('number') failed - got '{value}'")
        return value
    if prop.format is not None:
        check_format(prop.format, value)
    return value


def lxc_key_validity(key: str) -> tuple[bool, str | None]:
    """is_valid_lxc_conf_key: (valid, warning)."""
    if key.startswith("lxc.limit."):
        return True, f"{key}: lxc.limit.* was renamed to lxc.prlimit.*"
    if key in DEPRECATED_LXC_KEYS:
        return True, f"{key} is deprecated and was renamed to {DEPRECATED_LXC_KEYS[key]}"
    if key in VALID_LXC_KEYS:
        msg = VALID_LXC_KEYS[key]
        return (msg is None), (f"{key}: {msg}" if msg else None)
    if re.match(r"lxc\.(cgroup2?|prlimit|net)\.", key):
        return True, None
    return False, None


# --- parser / writer ---


def parse_config(kind: str, vmid: int, raw: str) -> GuestConfig:
    """parse_pct_config (kind 'lxc') or parse_vm_config (kind 'qemu'); warnings kept on the result."""
    conf = GuestConfig(kind=kind, vmid=vmid, digest=hashlib.sha1(raw.encode()).hexdigest())
    options = conf.options()
    section = conf.main
    section_name = ""
    descr: str | None = None

    def finish() -> None:
        nonlocal descr
        if kind == "lxc":
            if descr:
                section.description = descr
        elif descr is not None:
            section.description = descr.rstrip()
        descr = None

    pending_re = r"\[pve:pending\]\s*" if kind == "lxc" else r"\[PENDING\]\s*"
    for line in raw.split("\n"):
        if not line.strip():
            continue
        if re.fullmatch(pending_re, line, re.I):
            finish()
            section, section_name = conf.pending, "pending"
            continue
        if kind == "qemu" and re.fullmatch(r"\[special:cloudinit\]\s*", line, re.I):
            finish()
            section, section_name = conf.cloudinit, "cloudinit"
            continue
        m = re.fullmatch(r"\[([a-z][a-z0-9_\-]+)\]\s*", line, re.I)
        if m:
            finish()
            section_name = m.group(1)
            section = conf.snapshots.setdefault(section_name, Section())
            continue
        m = re.fullmatch(r"#(.*)", line)
        if m:
            descr = (descr or "") + decode_text(m.group(1)) + "\n"
            continue
        warn = f"vm {vmid} - "
        m = re.fullmatch(r"(lxc\.[a-z0-9_\-.]+)(:|\s*=)\s*(.*?)\s*", line)
        if kind == "lxc" and m:
            valid, msg = lxc_key_validity(m.group(1))
            if msg:
                conf.warnings.append(warn + msg)
            if valid:
                section.lxc.append((m.group(1), m.group(3)))
            elif not msg:
                conf.warnings.append(f"{warn}unable to parse config: {line}")
            continue
        m = re.fullmatch(r"(description):\s*(.*\S)\s*", line)
        if m:
            descr = (descr or "") + decode_text(m.group(2))
            continue
        m = re.search(r"snapstate:\s*(prepare|delete)\s*$", line)
        if m:
            if section_name not in ("", "pending", "cloudinit"):
                section.values["snapstate"] = m.group(1)  # kept in snapshot sections only
            continue
        m = re.fullmatch(r"delete:\s*(.*\S)\s*", line)
        if m:
            if section_name == "pending":
                section.values["delete"] = m.group(1)
            else:
                where = "[pve:pending]" if kind == "lxc" else "[PENDING]"
                conf.warnings.append(f"{warn}property 'delete' is only allowed in {where}")
            continue
        m = re.fullmatch(r"(args):\s*(.*\S)\s*", line)
        if kind == "qemu" and m:
            section.values["args"] = m.group(2)
            continue
        m = re.fullmatch(r"([a-z][a-z_]*\d*):\s*(.+?)\s*", line)
        if m:
            key, value = m.group(1), m.group(2)
            if section_name == "cloudinit":
                section.values[key] = value
                continue
            try:
                value = check_type(options, key, value)
            except FormatError as exc:
                conf.warnings.append(f"{warn}unable to parse value of '{key}' - {exc}".rstrip("\n"))
                if kind == "qemu":
                    continue  # qemu-server drops the value, pve-container keeps it
            if kind == "qemu" and key == "cdrom":
                key = "ide2"
            section.values[key] = value
            continue
        conf.warnings.append(f"{warn}unable to parse config: {line}")
    finish()
    return conf


def _raw_section(kind: str, section: Section, pending: bool) -> str:
    out = ""
    if section.description:
        out += "".join(f"#{encode_text(line)}\n" for line in perl_split_lines(section.description))
    elif section.description is not None and kind == "qemu" and pending:
        out += "#\n"  # an emptied description must survive in [PENDING]
    for key in sorted(section.values):
        value = section.values[key]
        if "\n" in value:
            raise PveError(f"detected invalid newline inside property '{key}'")
        out += f"{key}: {value}\n"
    for key, value in section.lxc:
        out += f"{key}: {value}\n"
    return out


def write_config(conf: GuestConfig) -> str:
    """write_pct_config / write_vm_config."""
    raw = _raw_section(conf.kind, conf.main, False)
    if conf.pending.values or conf.pending.lxc or conf.pending.description is not None:
        raw += "\n[pve:pending]\n" if conf.kind == "lxc" else "\n[PENDING]\n"
        raw += _raw_section(conf.kind, conf.pending, True)
    if conf.kind == "qemu" and conf.cloudinit.values:
        raw += "\n[special:cloudinit]\n" + _raw_section(conf.kind, conf.cloudinit, False)
    for name in sorted(conf.snapshots):
        raw += f"\n[{name}]\n" + _raw_section(conf.kind, conf.snapshots[name], False)
    return raw


# --- where things live ---


def node_name(root: Path) -> str:
    """The Proxmox node name: the twin's recorded node, else /etc/hostname, else ours."""
    info = root / TWIN_STATE / "pve.json"
    if info.exists():
        node = json.loads(info.read_text()).get("node")
        if node:
            return str(node)
    hostname = root / "etc/hostname"
    if hostname.exists() and hostname.read_text().strip():
        return hostname.read_text().split()[0].split(".")[0]
    return socket.gethostname().split(".")[0]


def config_dir(root: Path, kind: str) -> Path:
    sub = "lxc" if kind == "lxc" else "qemu-server"
    return root / "etc/pve/nodes" / node_name(root) / sub


def config_path(root: Path, kind: str, vmid: int) -> Path:
    return config_dir(root, kind) / f"{vmid}.conf"


def guest_ids(root: Path, kind: str) -> list[int]:
    directory = config_dir(root, kind)
    if not directory.is_dir():
        return []
    return sorted(int(p.stem) for p in directory.glob("*.conf") if p.stem.isdigit())


# Parser warnings of this process, for the CLI to print on stderr like perl's warn() does.
_WARNINGS: list[str] = []


def drain_warnings() -> list[str]:
    """Parse warnings since the last call, each once, in order."""
    found = list(dict.fromkeys(_WARNINGS))
    _WARNINGS.clear()
    return found


def load_config(root: Path, kind: str, vmid: int) -> GuestConfig:
    """load_config: missing files die with Proxmox's message."""
    path = config_path(root, kind, vmid)
    try:
        raw = path.read_text()
    except FileNotFoundError:
        sub = "lxc" if kind == "lxc" else "qemu-server"
        raise PveError(
            f"Configuration file 'nodes/{node_name(root)}/{sub}/{vmid}.conf' does not exist"
        ) from None
    conf = parse_config(kind, vmid, raw)
    _WARNINGS.extend(conf.warnings)
    return conf


def save_config(root: Path, conf: GuestConfig) -> None:
    """Write atomically, as pmxcfs does, and refresh the digest."""
    raw = write_config(conf)
    path = config_path(root, conf.kind, conf.vmid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(raw)
    os.replace(tmp, path)
    conf.digest = hashlib.sha1(raw.encode()).hexdigest()


# --- what the plumbing's supervisor needs to start a container ---


@dataclass(frozen=True)
class LxcDevice:
    """One devN entry (pve-container $dev_desc); uid/gid are container-side."""

    key: str
    path: str
    mode: str | None = None  # octal text, e.g. "0660"; None = Proxmox's default
    uid: int = 0
    gid: int = 0
    deny_write: bool = False


@dataclass(frozen=True)
class LxcConfig:
    """A container's current configuration (pending changes not applied)."""

    ctid: int
    hostname: str
    unprivileged: bool
    onboot: bool
    options: dict[str, str]
    devices: tuple[LxcDevice, ...]
    raw: tuple[tuple[str, str], ...]  # lxc.* entries in file order
    pending: dict[str, str]
    warnings: tuple[str, ...] = ()


def parse_device(value: str) -> LxcDevice:
    """PVE::LXC::Config::parse_device (without the key)."""
    parsed = parse_property_string(DEV_FMT, value)
    if "path" not in parsed:
        raise PveError("Path has to be defined")
    return LxcDevice(
        key="",
        path=parsed["path"],
        mode=parsed.get("mode"),
        uid=int(parsed.get("uid", "0")),
        gid=int(parsed.get("gid", "0")),
        deny_write=parsed.get("deny-write") == "1",
    )


def read_lxc(root: Path, ctid: int) -> LxcConfig:
    """Parse /etc/pve/lxc/<ctid>.conf for starting the container."""
    conf = load_config(root, "lxc", ctid)
    values = conf.main.values
    devices: list[LxcDevice] = []
    for key in sorted((k for k in values if re.fullmatch(r"dev\d+", k)), key=lambda k: int(k[3:])):
        try:
            dev = parse_device(values[key])
        except (FormatError, PveError) as exc:
            raise PveError(f"vm {ctid} - unable to parse value of '{key}' - {exc}") from None
        devices.append(LxcDevice(key, dev.path, dev.mode, dev.uid, dev.gid, dev.deny_write))
    return LxcConfig(
        ctid=ctid,
        hostname=values.get("hostname", f"CT{ctid}"),
        unprivileged=values.get("unprivileged") == "1",
        onboot=values.get("onboot") == "1",
        options=dict(values),
        devices=tuple(devices),
        raw=tuple(conf.main.lxc),
        pending=dict(conf.pending.values),
        warnings=tuple(conf.warnings),
    )


@dataclass(frozen=True)
class DeviceRule:
    """What Proxmox derives from one devN at start: live major:minor and cgroup lines."""

    key: str
    host_path: Path  # inside root
    container_path: str  # e.g. "dev/nvidia0", relative to the container rootfs
    kind: str  # "c" or "b"
    major: int
    minor: int
    mode: int
    uid: int
    gid: int
    cgroup_lines: tuple[str, ...]


def lxc_device_rules(root: Path, conf: LxcConfig) -> list[DeviceRule]:
    """Stat each devN on the host like Proxmox does at start (never stale: majors are live)."""
    rules = []
    for dev in conf.devices:
        host = root / dev.path.lstrip("/")
        try:
            st = os.stat(host)
        except FileNotFoundError:
            raise PveError(f"Device {dev.path} does not exist") from None
        if not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise PveError(f"{dev.path} is not a device")
        kind = "b" if stat.S_ISBLK(st.st_mode) else "c"
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        lines = [
            f"lxc.cgroup2.devices.allow = {kind} {major}:{minor} {'r' if dev.deny_write else 'rw'}"
        ]
        if dev.deny_write:
            lines.append(f"lxc.cgroup2.devices.deny = {kind} {major}:{minor} w")
        rules.append(
            DeviceRule(
                key=dev.key,
                host_path=host,
                container_path=dev.path.lstrip("/"),
                kind=kind,
                major=major,
                minor=minor,
                mode=int(dev.mode, 8) if dev.mode else 0o660,
                uid=dev.uid,
                gid=dev.gid,
                cgroup_lines=tuple(lines),
            )
        )
    return rules
