"""What a container's config grants at start (stdlib only): its devN entries read the way
pve-container does, resolved against the live device nodes (PVE::LXC::Config parse_device; the
plumbing's supervisor applies the rules)."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from .config import load_config
from .options import DEV_FMT
from .schema import (
    FormatError,
    PveError,
    parse_property_string,
)

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
    return [device_rule(root, dev) for dev in conf.devices]


def device_rule(root: Path, dev: LxcDevice) -> DeviceRule:
    """One devN against the live node (at start, or when hotplugged on PVE 9)."""
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
    return DeviceRule(
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
