"""What each GPU container's config must grant, and how to get there (pure; part of the Plan).

Two ways in (LxcGuest.devices):
- ``devN``: Proxmox device entries (`dev3: /dev/nvidia0,mode=0666`). Proxmox stat()s each node
  at container start and allows its LIVE major:minor, so they never go stale. pve-container
  5.0.7 (Proxmox VE 8.1) added them (its debian/changelog: "allow passing raw device nodes
  through to containers"); an older one refuses the plan. Only root@pam may set them, so they
  are set with `pct set` as root on the host.
- ``raw``: `lxc.cgroup2.devices.allow: c <major>:<minor> rwm` per node plus a bind
  `lxc.mount.entry`, majors from the live /proc/devices. Raw keys are no API parameters: the
  config file is edited (only gpuhost's own lines, guarded by the config digest).

Ownership: Proxmox's writer (PVE::LXC::Config::write_pct_config) moves every `#` line to the
top as the description and rewrites raw keys as `key: value` in their original order, so a
marker comment would not stay next to its lines. gpuhost instead records what it wrote in
/var/lib/gpuhost/ct-<ctid>-devices; an entry that is exactly what gpuhost would write (a devN
for a planned node, a planned raw line) is adopted. Every other entry is left alone; one that
grants an NVIDIA node (a blanket `c 195:* rwm`, another GPU) gives the container more than its
GPUs, so the plan names it in a note and the audit fails it until it is removed by hand.

The nodes (Plan.lxc_nodes): the container's GPUs plus nvidiactl, nvidia-uvm and
nvidia-uvm-tools. No /dev/nvidia-caps nodes: without MIG (which gpuhost does not configure)
CUDA opens none, and the two driver-wide ones (mig/config, mig/monitor) would let a container
reconfigure or watch the MIG state of every GPU of the host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuhost.observe.containers import PackageVersion
from gpuhost.observe.hostfacts import HostFacts
from gpuhost.observe.proxmox import GuestConfig
from gpuhost.paths import STATE_DIR
from gpuhost.plan.guests.devices import node_major, node_minor
from gpuhost.spec.guests import LxcGuest
from gpuhost.spec.host import HostSpec

RECORD_PREFIX = f"{STATE_DIR}/ct-"  # its own records
DEVN_SINCE = (5, 0, 7)  # pve-container 5.0.7 = Proxmox VE 8.1
DEV_MODE = "0666"  # the mode nvidia-modprobe gives the host's nodes (Proxmox's default: 0660)
DEV_KEY = re.compile(r"dev(\d+)")
MAX_DEV = 256  # dev0..dev255 (pve-container $MAX_DEVICES)
# A raw device rule (`lxc.cgroup2.devices.allow: c 195:0 rwm`), read by the plan and the audit.
ALLOW_KEY = re.compile(r"lxc\.cgroup2?\.devices\.allow")
_RULE = re.compile(
    r"(?P<type>[abc])(?:\s+(?P<major>\d+|\*):(?P<minor>\d+|\*))?(?:\s+(?P<access>[rwm]+))?"
)


@dataclass(frozen=True)
class DeviceRule:
    type: str  # "a" (every device) | "b" | "c"
    major: int | None  # None: any major
    minor: str  # a number or "*"


def parse_rule(value: str) -> DeviceRule | None:
    """A device rule's value, or None when it is not one."""
    m = _RULE.fullmatch(value.strip())
    if m is None:
        return None
    major = None if m["major"] in (None, "*") else int(m["major"])
    return DeviceRule(m["type"], major, m["minor"] or "*")


def record_path(ctid: int) -> str:
    return f"{RECORD_PREFIX}{int(ctid)}-devices"


def restart_marker(ctid: int) -> str:
    return f"{RECORD_PREFIX}{int(ctid)}-restart"


def raw_lines(nodes: tuple[str, ...], majors: dict[str, int]) -> tuple[str, ...] | None:
    """The raw lines for ``nodes`` at the live majors; None when a major is not registered."""
    rules, mounts = [], []
    for node in nodes:
        major, minor = node_major(node, majors), node_minor(node)
        if major is None or minor is None:
            return None
        rules.append(f"lxc.cgroup2.devices.allow: c {major}:{minor} rwm")
        target = node.removeprefix("/")
        mounts.append(f"lxc.mount.entry: {node} {target} none bind,optional,create=file")
    return (*rules, *mounts)


def dev_path(value: str) -> str:
    """The host path of a devN value (`/dev/x,mode=...` or `path=/dev/x,...`)."""
    for part in value.split(","):
        if "=" not in part:
            return part
        if part.startswith("path="):
            return part.removeprefix("path=")
    return ""


def effective_devs(config: GuestConfig) -> dict[str, str]:
    """devN entries as the next start will see them: current, then pending sets and deletes."""
    devs = {k: v for k, v in config.current.options.items() if DEV_KEY.fullmatch(k)}
    if config.pending is not None:
        for key in config.pending.options.get("delete", "").split(","):
            devs.pop(key.strip().lstrip("!"), None)
        devs.update({k: v for k, v in config.pending.options.items() if DEV_KEY.fullmatch(k)})
    return devs


def current_dev_paths(config: GuestConfig) -> list[str]:
    """The host paths of the devN entries in the current config."""
    return [dev_path(v) for k, v in config.current.options.items() if DEV_KEY.fullmatch(k)]


def _nvidia_rule(value: str, majors: dict[str, int]) -> bool:
    rule = parse_rule(value)
    live = {v for k, v in majors.items() if k.startswith("nvidia")}
    return rule is not None and rule.type == "c" and rule.major in live


@dataclass(frozen=True)
class ContainerDevices:
    """One container's GPU entries: what must be there, what gpuhost owns, what changes."""

    ctid: int
    mode: str  # "devN" | "raw"
    nodes: tuple[str, ...]  # host paths it must be granted (empty: none any more)
    dev: dict[str, str]  # devN key -> value as wanted (devN mode)
    raw: tuple[str, ...]  # raw "key: value" lines as wanted (raw mode)
    owned_raw: tuple[str, ...]  # raw lines in the config that are gpuhost's now
    dev_set: dict[str, str] = field(default_factory=dict)  # `pct set --devN value`
    dev_delete: tuple[str, ...] = ()  # `pct set --delete devN,...`
    raw_add: tuple[str, ...] = ()
    raw_remove: tuple[str, ...] = ()
    running: bool = False
    restart: bool = False  # a running container must restart to get what its config grants
    record: str = ""  # the record's content once applied

    @property
    def changes_config(self) -> bool:
        return bool(self.dev_set or self.dev_delete or self.raw_add or self.raw_remove)

    @property
    def summary(self) -> str:
        """One line for the plan: what the container is granted and what changes."""
        change = [f"set {', '.join(self.dev_set)}"] if self.dev_set else []
        change += [f"delete {', '.join(self.dev_delete)}"] if self.dev_delete else []
        change += [f"+{len(self.raw_add)} raw line(s)"] if self.raw_add else []
        change += [f"-{len(self.raw_remove)} raw line(s)"] if self.raw_remove else []
        change += ["restart"] if self.restart else []
        return (
            f"CT {self.ctid}: {len(self.nodes)} NVIDIA node(s) as {self.mode} entries; "
            f"{'; '.join(change) or 'no change'}"
        )


def _version_tuple(version: str) -> tuple[int, ...]:
    upstream = version.split(":", 1)[-1].split("-", 1)[0]
    return tuple(int(n) for n in re.findall(r"\d+", upstream))


def _devn_problem(guest: LxcGuest, where: str, pve: PackageVersion | None) -> str | None:
    if pve is None:
        return None  # not captured (an old snapshot): checked on the live host
    if pve.version is not None and _version_tuple(pve.version) >= DEVN_SINCE:
        return None
    found = f"pve-container {pve.version}" if pve.version else "no pve-container installed"
    return (
        f"{where}.devices = 'devN', but this host has {found}; devN entries came with "
        "pve-container 5.0.7 (Proxmox VE 8.1): upgrade Proxmox VE, or set "
        f"devices: raw for {guest.name} (cgroup rules from the live majors)"
    )


def _record_lines(text: str | None) -> list[str]:
    return [line for line in (text or "").splitlines() if line.strip()]


def plan_container(
    ctid: int,
    guest: LxcGuest | None,
    where: str,
    nodes: tuple[str, ...],
    facts: HostFacts,
    rebooting: bool,
    problems: list[str],
    notes: list[str],
) -> ContainerDevices | None:
    """The change for one container (``guest`` None: gone from the spec, so nothing wanted)."""
    config = facts.guest_configs.get(("lxc", ctid))
    label = guest.name if guest else f"CT {ctid}"
    if config is None:
        if nodes:
            notes.append(
                f"container {ctid} ({label}) does not exist on this host: its GPU entries are "
                "written once it does (pct create, then run the deploy again)"
            )
        return None
    mode = guest.devices if guest else "devN"
    majors = facts.char_devices
    files = facts.files or {}
    record = _record_lines(files.get(record_path(ctid)))
    wanted_raw: tuple[str, ...] = ()
    if nodes and mode == "raw":
        rendered = raw_lines(nodes, majors)
        if rendered is None:
            notes.append(
                f"{label}: nvidia-uvm has no major in /proc/devices (module not loaded): its raw "
                "rules are written after the boot that loads it"
            )
            return None
        if rebooting:
            notes.append(
                f"{label}: this run reboots the host and nvidia-uvm's major changes at boot: "
                "its raw rules are written by the next run, from that boot's /proc/devices"
            )
            return None
        wanted_raw = rendered
    if nodes and mode == "devN":
        problem = _devn_problem(guest, where, facts.pve_container) if guest else None
        if problem:
            problems.append(problem)
            return None
        if not rebooting and raw_lines(nodes, majors) is None:
            # pct set refuses a devN whose node does not exist, and without the driver's
            # modules loaded the boot unit has made none
            notes.append(
                f"{label}: the nvidia modules are not loaded, so its device nodes do not exist: "
                "its devN entries are set by a run after the boot that loads them"
            )
            return None
    lock = config.current.options.get("lock")
    if lock and (nodes or record):
        problems.append(
            f"{where or label}: CT {ctid} is locked ({lock}); wait for that task, or "
            f"`pct unlock {ctid}` if none runs, then run the deploy again"
        )
        return None
    # Lines gpuhost would write for these nodes in either mode are adoptable.
    adoptable_raw = set(raw_lines(nodes, majors) or ()) | set(wanted_raw)
    current_raw = [f"{k}: {v}" for k, v in config.current.raw]
    owned_raw = [ln for ln in current_raw if ln in record or ln in adoptable_raw]
    devs = effective_devs(config)
    owned_dev = {
        k: v
        for k, v in devs.items()
        if f"{k}: {v}" in record or (dev_path(v) in nodes and dev_path(v).startswith("/dev/nvidia"))
    }
    foreign = [
        f"{k}: {v}"
        for k, v in devs.items()
        if k not in owned_dev and dev_path(v).startswith("/dev/nvidia")
    ]
    for key, value in config.current.raw:
        line = f"{key}: {value}"
        if line in owned_raw:
            continue
        src = value.split()[0] if value.split() else ""
        if (key == "lxc.mount.entry" and src.startswith("/dev/nvidia")) or (
            ALLOW_KEY.fullmatch(key) and _nvidia_rule(value, majors)
        ):
            foreign.append(line)
    if foreign:
        notes.append(
            f"{label}: /etc/pve/lxc/{ctid}.conf has NVIDIA device entries gpuhost did not "
            f"write, left as they are: {'; '.join(foreign)}. They give it more than the plan "
            "(or the same twice; the audit fails ct.device_rules): remove them by hand"
        )

    wanted_dev: dict[str, str] = {}
    if mode == "devN":
        by_path = {dev_path(v): k for k, v in owned_dev.items()}
        taken = set(devs) - set(owned_dev)
        free = (f"dev{i}" for i in range(MAX_DEV) if f"dev{i}" not in taken)
        reserved = {by_path[n] for n in nodes if n in by_path}
        for node in nodes:
            key = by_path.get(node)
            if key is None:
                key = next(k for k in free if k not in reserved and k not in wanted_dev)
            wanted_dev[key] = f"{node},mode={DEV_MODE}"
    dev_set = {k: v for k, v in wanted_dev.items() if devs.get(k) != v}
    dev_delete = tuple(sorted((k for k in owned_dev if k not in wanted_dev), key=_dev_index))
    raw_add = tuple(ln for ln in wanted_raw if ln not in current_raw)
    raw_remove = tuple(ln for ln in owned_raw if ln not in wanted_raw)
    running = (facts.guest_statuses or {}).get(("lxc", ctid)) == "running"
    current_devs = {k: v for k, v in config.current.options.items() if DEV_KEY.fullmatch(k)}
    ours = set(owned_dev) | {
        k for k, v in current_devs.items() if dev_path(v).startswith("/dev/nvidia")
    }
    pending_owned = any(current_devs.get(k) != devs.get(k) for k in ours)
    changed = bool(dev_set or dev_delete or raw_add or raw_remove)
    restart = running and (changed or pending_owned or restart_marker(ctid) in files)
    final = [f"{k}: {v}" for k, v in sorted(wanted_dev.items(), key=lambda i: _dev_index(i[0]))]
    record_text = "".join(f"{line}\n" for line in [*final, *wanted_raw])
    if not (changed or restart or nodes or record):
        return None
    return ContainerDevices(
        ctid=ctid,
        mode=mode,
        nodes=nodes,
        dev=wanted_dev,
        raw=wanted_raw,
        owned_raw=tuple(owned_raw),
        dev_set=dev_set,
        dev_delete=dev_delete,
        raw_add=raw_add,
        raw_remove=raw_remove,
        running=running,
        restart=restart,
        record=record_text,
    )


def _dev_index(key: str) -> int:
    return int(key[3:])


def plan_containers(
    spec: HostSpec,
    facts: HostFacts,
    lxc_nodes: dict[int, tuple[str, ...]],
    rebooting: bool,
    problems: list[str],
    notes: list[str],
) -> dict[int, ContainerDevices]:
    """Every container that has GPU entries to write, keep or remove."""
    guests = {g.ctid: (i, g) for i, g in enumerate(spec.guests) if isinstance(g, LxcGuest)}
    recorded = {
        int(path.removeprefix(RECORD_PREFIX).removesuffix("-devices"))
        for path in (facts.files or {})
        if re.fullmatch(re.escape(RECORD_PREFIX) + r"\d+-devices", path)
    }
    planned: dict[int, ContainerDevices] = {}
    for ctid in sorted(set(guests) | set(lxc_nodes) | recorded):
        index, guest = guests.get(ctid, (None, None))
        where = f"guests[{index}]" if index is not None else ""
        found = plan_container(
            ctid, guest, where, lxc_nodes.get(ctid, ()), facts, rebooting, problems, notes
        )
        if found is not None:
            planned[ctid] = found
    return planned


def edit_raw(text: str, remove: tuple[str, ...], add: tuple[str, ...]) -> str:
    """``text`` (a container config) without the ``remove`` lines of its current section and
    with ``add`` appended to that section, where Proxmox's writer keeps raw keys; every other
    byte stays as it was. Raw lines are compared in Proxmox's `key: value` form."""
    lines = text.splitlines(keepends=True)
    end = next((i for i, line in enumerate(lines) if re.match(r"\[[^\]]+\]\s*$", line)), len(lines))
    drop = set(remove)
    kept: list[str] = []
    for line in lines[:end]:
        m = re.match(r"(lxc\.[a-z0-9_\-.]+)(?::|\s*=)\s*(.*?)\s*$", line)
        if m and f"{m[1]}: {m[2]}" in drop:
            continue
        kept.append(line)
    tail = len(kept)
    while tail and not kept[tail - 1].strip():
        tail -= 1  # the blank line before the next section stays after the added lines
    if tail and not kept[tail - 1].endswith("\n"):
        kept[tail - 1] += "\n"
    body = kept[:tail] + [f"{line}\n" for line in add] + kept[tail:]
    return "".join(body + lines[end:])
