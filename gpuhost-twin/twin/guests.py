"""LXC guests of a twin: real privileged LXC containers, started the way Proxmox would.

Each guest is a real container (`lxc-start`) whose rootfs is an overlay on the twin base, kept under
the twin's state dir (guests/<ctid>/upper persists across stops and reboots). It shares the host's
network namespace (lxc.net.0.type = none) and runs its own sshd as init on 127.<twin>.<ctid>:22.

Devices are granted only as /etc/pve/lxc/<ctid>.conf inside the twin says (read with the Proxmox
simulation's own reader, twin/pve/lxc_devices.py), resolved at start against the twin's LIVE nodes
(<twin root>/dev), like pve-container does:
- `devN: /dev/x[,uid=,gid=,mode=,deny-write=1]`: stat the twin's node (error `Device /dev/x does not
  exist` / `/dev/x is not a device`), allow exactly its major:minor, mknod a copy with the given
  owner and mode, bind it onto the guest's /dev/x.
- `lxc.cgroup2.devices.allow|deny` and `lxc.mount.entry` lines: passed to LXC (cgroup2 keys become
  cgroup v1 `lxc.cgroup.devices.*` on a v1 machine), with mount sources taken from the twin's root.
  `lxc.cgroup.devices.*` (v1) keys only where the simulated host runs the hybrid layout
  (`legacy_cgroup_devices`); on a pure cgroup2 host LXC ignores them.
The kernel's device controller enforces the rules, so a stale major in the conf really leaves the
guest unable to open the node (EPERM); an allowed node without a driver gives ENXIO.
The twin's /proc/driver and /sys/module are bound into every guest read-only (KERNEL_VIEWS), as
a container sees its host kernel's: the driver version, nvidia_uvm's parameters, the RM file.
Other raw `lxc.*` keys and Proxmox keys other than hostname/devN/onboot are not applied, and
`unprivileged: 1` is not honoured (every guest is privileged, with an identity uid map).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

from twin import mounts, node, processes
from twin.pve import config as pve_config
from twin.pve import guest_state, lxc_devices, runtime, startstop, tasks
from twin.pve.schema import PveError

CGROUP_V1 = Path("/sys/fs/cgroup/devices").is_dir()
DEVICES_KEY = "lxc.cgroup.devices" if CGROUP_V1 else "lxc.cgroup2.devices"
# LXC's common.conf device list (what every Proxmox container gets before its own lines).
DEFAULT_DEVICES = (
    "deny = a",
    "allow = b *:* m",
    "allow = c *:* m",
    "allow = c 1:3 rwm",
    "allow = c 1:5 rwm",
    "allow = c 1:7 rwm",
    "allow = c 1:8 rwm",
    "allow = c 1:9 rwm",
    "allow = c 5:0 rwm",
    "allow = c 5:1 rwm",
    "allow = c 5:2 rwm",
    "allow = c 136:* rwm",
    "allow = c 10:229 rwm",
    "allow = c 10:200 rwm",
)
# A real container sees the host kernel's /proc/driver (nvidia/ and, on a twin, the RM file the
# stand-in libcuda reads: hwsim/rm.py) and /sys/module (nvidia_uvm's parameters): the twin's
# simulated ones are bound in read-only. Directories, not files: the twin rewrites files inside
# atomically (rename), which a file bind would not follow.
KERNEL_VIEWS = ("proc/driver", "sys/module")
_monitors: dict[str, subprocess.Popen[bytes]] = {}  # lxc-start -F per running guest
ATTACH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def answer(rc: int, stdout: str = "", stderr: str = "") -> dict[str, Any]:
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def container_name(twin: node.Twin, ctid: int) -> str:
    return f"{twin.name}-{ctid}"  # unique machine-wide: LXC's cgroup names are not per lxcpath


def is_running(twin: node.Twin, ctid: int) -> bool:
    res = subprocess.run(
        ["lxc-info", "-P", str(twin.dir / "lxc"), "-n", container_name(twin, ctid), "-s", "-H"],
        capture_output=True,
        text=True,
    )
    return res.stdout.strip() == "RUNNING"


def device_lines(twin: node.Twin, ctid: int, conf: lxc_devices.LxcConfig) -> list[str]:
    """The LXC config lines that grant exactly what the CT config grants, against live nodes."""
    passthrough = twin.dir / "guests" / str(ctid) / "passthrough"
    shutil.rmtree(passthrough, ignore_errors=True)
    passthrough.mkdir(parents=True)
    lines = [f"{DEVICES_KEY}.{rule}" for rule in DEFAULT_DEVICES]
    for rule in lxc_devices.lxc_device_rules(twin.root, conf):  # raises "Device ... does not exist"
        for line in rule.cgroup_lines:
            key, value = (part.strip() for part in line.split("=", 1))
            lines.append(f"{_devices_key(key)} = {value}")
        # Like pve-container's pre-start hook: a private copy of the node with the CT's owner and
        # mode, bind-mounted onto the guest's /dev path.
        copy = passthrough / rule.container_path.replace("/", "_")
        kind = stat.S_IFCHR if rule.kind == "c" else stat.S_IFBLK
        os.mknod(copy, rule.mode | kind, os.makedev(rule.major, rule.minor))
        os.chown(copy, rule.uid, rule.gid)
        copy.chmod(rule.mode)
        lines.append(f"lxc.mount.entry = {copy} {rule.container_path} none bind,create=file 0 0")
    legacy = legacy_cgroup_devices(twin.root)
    for key, value in conf.raw:
        if re.fullmatch(r"lxc\.cgroup\.devices\.(allow|deny)", key) and not legacy:
            continue  # LXC ignores cgroup v1 limits on a pure cgroup2 host (see below)
        if re.fullmatch(r"lxc\.cgroup2?\.devices\.(allow|deny)", key):
            lines.append(f"{_devices_key(key)} = {value}")
        elif key == "lxc.mount.entry":
            src, *rest = value.split()
            if src.startswith("/"):  # the twin's root is this guest's host filesystem
                src = str(twin.root / src.lstrip("/"))
            lines.append(f"lxc.mount.entry = {' '.join([src, *rest])}")
    return lines


def legacy_cgroup_devices(root: Path) -> bool:
    """Whether the simulated host has cgroup v1's devices controller, so that a CT's
    `lxc.cgroup.devices.*` keys take effect. Proxmox VE 7 and later boot pure cgroup2 (systemd's
    default) unless the command line has systemd.unified_cgroup_hierarchy=0; PVE 9 removed the
    hybrid layout (pve-manager PVE/CLI/pve8to9.pm, check_containers_cgroup_compat). On pure
    cgroup2, LXC skips every lxc.cgroup.* key with "Ignoring legacy cgroup limits on pure
    cgroup2 system" (lxc src/lxc/cgroups/cgfsng.c, cgfsng_setup_limits_legacy)."""
    if pve_config.pve_release(root) >= 9:
        return False
    cmdline = root / "proc/cmdline"
    words = cmdline.read_text().split() if cmdline.exists() else []
    return any(
        w in words
        for w in (
            "systemd.unified_cgroup_hierarchy=0",
            "systemd.unified_cgroup_hierarchy=false",
            "systemd.unified_cgroup_hierarchy=no",
        )
    )


def kernel_view_lines(twin: node.Twin) -> list[str]:
    lines = []
    for view in KERNEL_VIEWS:
        (twin.root / view).mkdir(parents=True, exist_ok=True)
        lines.append(f"lxc.mount.entry = {twin.root / view} {view} none bind,ro 0 0")
    return lines


def _devices_key(key: str) -> str:
    """Proxmox writes cgroup2 keys; LXC on a cgroup v1 machine needs the v1 spelling."""
    return f"{DEVICES_KEY}.{key.rsplit('.', 1)[1]}"


def _prepare_rootfs(twin: node.Twin, ctid: int, hostname: str) -> Path:
    gdir = twin.dir / "guests" / str(ctid)
    for sub in ("upper", "work", "root"):
        (gdir / sub).mkdir(mode=0o755, parents=True, exist_ok=True)
    groot = gdir / "root"
    if not mounts.mounts_below(groot):
        # A guest keeps the base it was made on: a host upgrade (twin/upgrade.py) leaves the
        # containers' own Debian as it was.
        kept = gdir / "base"
        base = kept.read_text().strip() if kept.is_file() else twin.base
        mounts.mount_overlay(Path(base), gdir / "upper", gdir / "work", groot)
    key = groot / "etc/ssh/ssh_host_ed25519_key"
    if not key.exists():
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"root@{hostname}",
                "-f",
                str(key),
            ],
            check=True,
        )
    shutil.copy(key.with_suffix(".pub"), gdir / "ssh_host_ed25519_key.pub")
    (groot / "etc/ssh/sshd_config.d/gpuhost-twin.conf").write_text(
        f"# gpuhost twin guest: shares the twin machine's network, so it listens on its own address\n"
        f"ListenAddress {twin.guest_address(ctid)}:22\n"
        "HostKey /etc/ssh/ssh_host_ed25519_key\n"
        "UsePAM no\n"
    )
    (groot / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    shutil.copy(node.client_key().with_suffix(".pub"), groot / "root/.ssh/authorized_keys")
    (groot / "etc/hostname").write_text(hostname + "\n")
    # What systemd as a Proxmox CT's init writes at boot; the guests' init is sshd, which
    # rewrites the environment LXC gives pid 1 (container=lxc), so this is how they are told.
    (groot / "run/systemd").mkdir(parents=True, exist_ok=True)
    (groot / "run/systemd/container").write_text("lxc\n")
    # No systemd in a guest (its init is sshd): a small service manager that really runs units'
    # ExecStart= with their environment stands in for systemctl (shims/guest-systemctl).
    systemctl = groot / "usr/local/bin/systemctl"
    systemctl.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(node.SHIMS / "guest-systemctl", systemctl)
    systemctl.chmod(0o755)
    return groot


def start(twin: node.Twin, ctid: int) -> dict[str, Any]:
    try:
        conf = lxc_devices.read_lxc(twin.root, ctid)
        if is_running(twin, ctid):
            raise PveError(f"CT {ctid} already running")
        groot = _prepare_rootfs(twin, ctid, conf.hostname)
        devices = device_lines(twin, ctid, conf)
    except PveError as exc:
        _teardown(twin, ctid)
        return answer(255, stderr=f"{exc}\n")
    hostname = conf.hostname
    name = container_name(twin, ctid)
    gdir = twin.dir / "guests" / str(ctid)
    config = [
        f"lxc.uts.name = {hostname}",
        f"lxc.rootfs.path = dir:{groot}",
        "lxc.net.0.type = none",
        "lxc.autodev = 1",
        "lxc.tty.max = 0",
        "lxc.pty.max = 64",
        "lxc.mount.auto = proc:mixed sys:ro cgroup:mixed",
        "lxc.apparmor.profile = unconfined",
        "lxc.init.cmd = /usr/sbin/sshd -D -e",
        f"lxc.console.logfile = {gdir / 'console.log'}",
        f"lxc.log.file = {gdir / 'lxc.log'}",
        *kernel_view_lines(twin),
        *devices,
    ]
    cdir = twin.dir / "lxc" / name
    cdir.mkdir(parents=True, exist_ok=True)
    (cdir / "config").write_text("\n".join(config) + "\n")
    # The guest's key goes into known_hosts before its sshd listens: a client that sees port 22
    # open (a test waiting for an onboot start) must find the key already there.
    node.write_known_hosts()
    # Foreground (-F) as our child, not daemonized: the supervisor reaps the monitor itself
    # instead of leaving a zombie to an init that may not reap.
    with open(gdir / "lxc-start.log", "ab") as out:
        _monitors[name] = subprocess.Popen(
            ["lxc-start", "-P", str(twin.dir / "lxc"), "-n", name, "-F"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    up = processes.wait_port(twin.guest_address(ctid), 22, timeout=15, alive=_monitors[name])
    if not up:
        log_tail = ""
        for logfile in (gdir / "lxc-start.log", gdir / "lxc.log"):
            if logfile.exists():
                log_tail += logfile.read_text(errors="replace")[-1000:]
        _stop_container(twin.dir, name)
        _teardown(twin, ctid)
        return answer(255, stderr=f"{log_tail}startup for container '{ctid}' failed\n")
    guest_state.set_running(twin.root, "lxc", ctid, True, address=twin.guest_address(ctid))
    return answer(0)


def stop(twin: node.Twin, ctid: int) -> dict[str, Any]:
    try:
        pve_config.load_config(twin.root, "lxc", ctid)
    except PveError as exc:
        return answer(255, stderr=f"{exc}\n")
    if not is_running(twin, ctid):
        return answer(255, stderr=f"CT {ctid} not running\n")
    _stop_container(twin.dir, container_name(twin, ctid))
    _teardown(twin, ctid)
    return answer(0)


def status(twin: node.Twin, ctid: int) -> dict[str, Any]:
    try:
        pve_config.load_config(twin.root, "lxc", ctid)
    except PveError as exc:
        return answer(255, stderr=f"{exc}\n")
    return answer(0, stdout=f"status: {'running' if is_running(twin, ctid) else 'stopped'}\n")


def exec_(twin: node.Twin, ctid: int, argv: list[str], stdin: str | None) -> dict[str, Any]:
    """`pct exec <ctid> -- argv`: run in the container; its exit status passes through."""
    if not is_running(twin, ctid):
        return answer(255, stderr=f"container '{ctid}' not running!\n")
    cmd = ["lxc-attach", "-P", str(twin.dir / "lxc"), "-n", container_name(twin, ctid)]
    cmd += ["--clear-env", "--set-var", f"PATH={ATTACH_PATH}", "--set-var", "HOME=/root", "--"]
    res = subprocess.run(cmd + argv, input=stdin or "", capture_output=True, text=True)
    return answer(res.returncode, res.stdout, res.stderr)


def hotplug_device(twin: node.Twin, ctid: int, value: str) -> dict[str, Any]:
    """PVE 9 (pve-container 6.0.4+, LXC.pm device_passthrough_hotplug): a devN added to a running
    CT gets its node at once, with the CT's mode and owner, and the cgroup allows it (lxc-cgroup
    devices.allow, then devices.deny w for deny-write). Proxmox bind-mounts a private node onto
    the path; the twin makes the node there, which the guest sees the same way."""
    if not is_running(twin, ctid):
        return answer(255, stderr=f"container '{ctid}' not running!\n")
    try:
        rule = lxc_devices.device_rule(twin.root, lxc_devices.parse_device(value))
    except PveError as exc:
        return answer(255, stderr=f"{exc}\n")
    where = ["-P", str(twin.dir / "lxc"), "-n", container_name(twin, ctid)]
    path = "/" + rule.container_path
    script = (
        'mkdir -p "$(dirname "$1")" && rm -f "$1" && mknod "$1" "$2" "$3" "$4" && '
        'chmod "$5" "$1" && chown "$6:$7" "$1"'
    )
    node_args = [path, rule.kind, str(rule.major), str(rule.minor), oct(rule.mode)[2:]]
    steps = [
        ["lxc-attach", *where, "--clear-env", "--", "sh", "-c", script, "sh", *node_args,
         str(rule.uid), str(rule.gid)],
        *(["lxc-cgroup", *where, f"devices.{line.split('.')[-1].split()[0]}",
           line.split("=", 1)[1].strip()] for line in reversed(rule.cgroup_lines)),
    ]  # fmt: skip
    for argv in steps:
        res = subprocess.run(argv, capture_output=True, text=True)
        if res.returncode != 0:
            return answer(255, stderr=f"hotplug of {path} failed: {res.stderr.strip()}\n")
    return answer(0)


def push(twin: node.Twin, ctid: int, file: str, dest: str, perms: Any) -> dict[str, Any]:
    """`pct push <ctid> <file> <dest> [--perms]`: the twin's file, written from inside the
    container (as pct does after entering its mount namespace), so a symlink in the guest
    cannot point it outside."""
    if not is_running(twin, ctid):
        return answer(255, stderr="can only push files to a running CT\n")
    source = twin.root / file.lstrip("/")
    try:
        data = source.read_bytes()
    except OSError:
        return answer(255, stderr=f"failed to open {file} for reading\n")
    mode = str(perms) if perms else "0644"
    if not re.fullmatch(r"0[0-7]{3,4}", mode):
        return answer(255, stderr=f"invalid perms {mode!r}\n")
    cmd = ["lxc-attach", "-P", str(twin.dir / "lxc"), "-n", container_name(twin, ctid)]
    cmd += ["--clear-env", "--set-var", f"PATH={ATTACH_PATH}", "--"]
    script = 'umask 077 && cat > "$1" && chmod "$2" "$1"'
    res = subprocess.run([*cmd, "sh", "-c", script, "sh", dest, mode], input=data,
                         capture_output=True)  # fmt: skip
    if res.returncode != 0:
        return answer(255, stderr=res.stderr.decode(errors="replace") or "push failed\n")
    return answer(0)


def start_onboot(twin: node.Twin) -> None:
    """pve-guests.service at boot (pve-manager services/pve-guests.service: ExecStart=/usr/bin/
    pvesh --nooutput create /nodes/localhost/startall, after the boot units gpuhost orders
    Before=it): startall without force (twin/pve/startstop.py), so every
    guest with `onboot: 1` starts in startup order (ascending `order`, guests without one last,
    vmid within an order), `up` seconds apart. VMs are state only (runtime.start_qemu)."""

    def start_guest(root: Path, kind: str, vmid: int) -> str | None:
        # Each start is a task of its own, like vm_start's (its log: the hookscript's output).
        def work(w: tasks.Worker) -> None:
            if kind == "qemu":
                runtime.start_qemu(root, vmid, warn=w.warn, hook_log=w.log)
                return
            result = runtime.start_lxc(
                root, vmid, log=w.log, warn=w.warn, start=lambda: start(twin, vmid)
            )
            if result["rc"] != 0:
                raise PveError(str(result["stderr"]) or f"start of CT {vmid} failed")

        return tasks.run_sync(root, "vzstart" if kind == "lxc" else "qmstart", vmid, work)

    for warning in startstop.startall(twin.root, start_guest, why="boot"):
        print(f"onboot: {warning}", flush=True)


def stop_all(tdir: Path) -> None:
    """Stop every guest of a twin (by its state dir: also works when twin.json is damaged)."""
    lxc = tdir / "lxc"
    for cdir in sorted(lxc.glob("*")) if lxc.is_dir() else []:
        _stop_container(tdir, cdir.name)
    for groot in sorted((tdir / "guests").glob("*/root")):
        mounts.unmount_below(groot)
        shutil.rmtree(groot.parent / "passthrough", ignore_errors=True)
    ct_state = tdir / "root" / "run/gpuhost-twin/ct"
    if ct_state.is_dir():
        shutil.rmtree(ct_state, ignore_errors=True)


def _stop_container(tdir: Path, name: str) -> None:
    subprocess.run(
        ["lxc-stop", "-P", str(tdir / "lxc"), "-n", name, "-k"], capture_output=True, text=True
    )
    monitor = _monitors.pop(name, None)
    if monitor is not None:
        try:
            monitor.wait(timeout=10)
        except subprocess.TimeoutExpired:
            monitor.kill()
            monitor.wait()


def _teardown(twin: node.Twin, ctid: int) -> None:
    gdir = twin.dir / "guests" / str(ctid)
    mounts.unmount_below(gdir / "root")
    shutil.rmtree(gdir / "passthrough", ignore_errors=True)
    guest_state.set_running(twin.root, "lxc", ctid, False)
