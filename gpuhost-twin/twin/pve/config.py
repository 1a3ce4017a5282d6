"""Guest config files under /etc/pve, read and written the way Proxmox does (stdlib only).

Sources (docs/reference/formats.md §1, §3): pve-container PVE::LXC::Config parse_pct_config / write_pct_config /
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
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from .options import DEPRECATED_LXC_KEYS, LXC_OPTIONS, QEMU_OPTIONS, VALID_LXC_KEYS
from .schema import (
    FormatError,
    Prop,
    PveError,
    check_format,
    parse_boolean,
)
from .state import TWIN_STATE, WARNINGS, drain_warnings  # noqa: F401 (re-exported)

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


# Raw lxc keys pve-container allows only from a Proxmox VE release on: lxc.init.cwd came with
# 6.0.1 (1c7f64d "config: whitelist lxc.init.cwd"); stable-bookworm's 5.3.5 refuses it.
LXC_KEYS_FROM = {"lxc.init.cwd": 9}


def lxc_key_validity(key: str, release: int = 8) -> tuple[bool, str | None]:
    """is_valid_lxc_conf_key: (valid, warning), on Proxmox VE ``release``."""
    if release < LXC_KEYS_FROM.get(key, 0):
        return False, None
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


def parse_config(kind: str, vmid: int, raw: str, release: int = 8) -> GuestConfig:
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
            valid, msg = lxc_key_validity(m.group(1), release)
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


def pve_release(root: Path) -> int:
    """The Proxmox VE major release the twin runs (pve.json, from the profile's `pve:`)."""
    info = root / TWIN_STATE / "pve.json"
    if info.exists():
        return int(json.loads(info.read_text()).get("pve", 8))
    return 8


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
    conf = parse_config(kind, vmid, raw, pve_release(root))
    WARNINGS.extend(conf.warnings)
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
