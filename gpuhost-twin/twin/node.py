"""One twin: an overlay on the cached base, its own sshd on 127.0.0.N:22, and a supervisor.

Host-side layout (every component root-owned and not group/world-writable: sshd's ChrootDirectory
and StrictModes demand it):

    /var/lib/gpuhost-twin/              STATE_ROOT (env GPUHOST_TWIN_STATE)
        client/id_ed25519[.pub]         the fleet's one client key
        known_hosts, ssh_config         every twin's and guest's host key; a ready ssh config
        <name>/twin.json                name, index, address, profile
        <name>/upper, work, root        overlay layers; root is the mount point = ChrootDirectory
        <name>/ssh/                     sshd_config, host key, authorized_keys
        <name>/guests/<ctid>/           a guest's overlay layers and passthrough device nodes
        <name>/lxc/                     the LXC path of the twin's guests
        <name>/supervisor.{pid,log}, sshd.log, ready
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from twin import rootfs
from twin.errors import TwinError
from twin.mounts import mount_overlay, unmount_below
from twin.processes import _alive, kill_processes, port_22_problem

STATE_ROOT = Path(os.environ.get("GPUHOST_TWIN_STATE", "/var/lib/gpuhost-twin"))
SHIMS = Path(__file__).parent / "shims"
SSHD = shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin") or "/usr/sbin/sshd"
READY_TIMEOUT = 30.0


# Twins from this index up belong to test sessions (127.0.0.201 and up), below to developers.
FIRST_TEST_INDEX = 200


@dataclass(frozen=True)
class Twin:
    name: str
    index: int  # twinN -> N; picks the loopback address
    profile: str | None  # profile name or YAML path; None = a bare Debian host
    base: str  # the cached base rootfs this twin and its guests are overlays on

    @property
    def address(self) -> str:
        return f"127.0.0.{self.index + 1}"

    @property
    def dir(self) -> Path:
        return STATE_ROOT / self.name

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh" / "ssh_host_ed25519_key"

    def save(self) -> None:
        _write_atomic(self.dir / "twin.json", json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, name: str) -> Twin:
        return cls(**json.loads((STATE_ROOT / name / "twin.json").read_text()))

    def guest_address(self, ctid: int) -> str:
        """A guest's SSH endpoint: unique per twin and container id, stable across restarts."""
        return f"127.{self.index}.{(ctid >> 8) & 255}.{ctid & 255}"


def client_key() -> Path:
    return STATE_ROOT / "client" / "id_ed25519"


def known_hosts() -> Path:
    return STATE_ROOT / "known_hosts"


def ssh_config() -> Path:
    return STATE_ROOT / "ssh_config"


def twin_name(index: int) -> str:
    return f"twin{index}"


def load_profile(name: str) -> Any:
    """A hardware profile by name (twin/profiles/<name>.yaml) or YAML path, validated."""
    from twin.profile import load_profile as load  # the hardware helper's module

    return load(name)


# ---------------------------------------------------------------- fleet-wide


# What starting a twin needs on the machine (gpuhost-twin/twin/APT_PACKAGES installs them).
TOOLS = ("debootstrap", "sshd", "ssh-keygen", "ssh", "lxc-start", "lxc-attach", "mount", "unshare")
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INSTALL_HINT = "apt-get install $(grep -v '^#' gpuhost-twin/twin/APT_PACKAGES)"


def missing_tools() -> list[str]:
    return [t for t in TOOLS if not shutil.which(t, path=SBIN_PATH)]


def check_machine() -> None:
    """Fail with one line saying what to do when this machine cannot run twins."""
    rootfs.forbidden()
    missing = missing_tools()
    if missing:
        raise TwinError(f"missing {', '.join(missing)}; install with: {INSTALL_HINT}")
    problem = port_22_problem()
    if problem:
        raise TwinError(problem)


def ensure_fleet() -> None:
    """State root, the client key and sshd's privilege-separation directory."""
    STATE_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    rootfs.check_chroot_safe(STATE_ROOT)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd refuses to start without it
    key = client_key()
    if key.exists():
        return
    key.parent.mkdir(mode=0o700, exist_ok=True)
    # Test sessions of several checkouts may start their first twin at once: one makes the key.
    with (key.parent / ".keygen.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not key.exists():
            _keygen(key, "gpuhost-twin client")


def _keygen(path: Path, comment: str) -> None:
    tmp = path.with_name(f"{path.name}.new{os.getpid()}")
    for p in (tmp, tmp.with_name(tmp.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(tmp)], check=True
    )
    tmp.with_name(tmp.name + ".pub").rename(path.with_name(path.name + ".pub"))
    tmp.rename(path)


def write_known_hosts() -> None:
    """Rewrite known_hosts and ssh_config from every twin's and guest's host key (under a lock)."""
    hosts: list[tuple[str, Path]] = []  # (address, public host key file)
    for twin in list_twins():
        hosts.append((twin.address, twin.host_key.with_suffix(".pub")))
        for gdir in sorted((twin.dir / "guests").glob("*")):
            if gdir.name.isdigit():
                hosts.append(
                    (twin.guest_address(int(gdir.name)), gdir / "ssh_host_ed25519_key.pub")
                )
    lines = []
    for addr, pub in hosts:
        try:
            lines.append(f"{addr} {' '.join(pub.read_text().split()[:2])}\n")
        except FileNotFoundError:
            continue  # not made yet, or being removed
    config = [
        "# gpuhost twins: ssh -F this-file root@127.0.0.N\n",
        "Host 127.*\n",
        "  User root\n",
        f"  IdentityFile {client_key()}\n",
        "  IdentitiesOnly yes\n",
        f"  UserKnownHostsFile {known_hosts()}\n",
        "  StrictHostKeyChecking yes\n",
    ]
    STATE_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(STATE_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _write_atomic(known_hosts(), "".join(lines))
        _write_atomic(ssh_config(), "".join(config))


def _prune_bases(keep: set[Path]) -> None:
    """Bases of older recipes take ~0.5 GB each; drop those no running twin stands on."""
    for old in rootfs.CACHE_ROOT.glob("base-*"):
        if old.is_dir() and old not in keep and not old.name.endswith(".building"):
            shutil.rmtree(old)


def list_twins() -> list[Twin]:
    if not STATE_ROOT.is_dir():
        return []
    twins = []
    for path in STATE_ROOT.glob("*/twin.json"):
        try:
            twins.append(Twin.load(path.parent.name))
        except (OSError, ValueError, TypeError):
            continue  # being removed by a concurrent stop
    return sorted(twins, key=lambda t: t.index)


# ---------------------------------------------------------------- one twin


def create(twin: Twin) -> None:
    """Lay out and mount a new twin, install its shims and hardware, before its first boot."""
    if twin.dir.exists():
        raise TwinError(
            f"{twin.name} exists already; stop it first (python -m twin stop {twin.name})"
        )
    for sub in ("upper", "work", "root", "ssh", "guests", "lxc"):
        (twin.dir / sub).mkdir(mode=0o755, parents=True)
    twin.save()
    mount_overlay(Path(twin.base), twin.dir / "upper", twin.dir / "work", twin.root)
    _keygen(twin.host_key, f"root@{twin.name}")
    shutil.copy(client_key().with_suffix(".pub"), twin.dir / "ssh" / "authorized_keys")
    (twin.dir / "ssh" / "sshd_config").write_text(_sshd_config(twin))
    _install_userland(twin)
    if twin.profile is not None:
        from twin import hardware, pve  # the hardware and Proxmox helpers' modules

        profile = load_profile(twin.profile)
        hardware.install(twin.root, profile)
        pve.install(twin.root, profile)
        from twin.pve import access, api

        # An API token for proxmoxer, privilege-separated like `pveum user token add` makes it,
        # with the ACLs a gpuhost deploy needs (README: the twin's Proxmox API); the secret is
        # kept outside the twin, readable by root only.
        secret = api.create_token(twin.root, "root@pam", "gpuhost")
        for path, role in access.GPUHOST_TOKEN_ACLS:
            access.grant(twin.root, path, role, "root@pam!gpuhost")
        token = twin.dir / "api-token"
        token.touch(mode=0o600)
        token.write_text(f"root@pam!gpuhost={secret}\n")


def _sshd_config(twin: Twin) -> str:
    ssh = twin.dir / "ssh"
    return f"""# gpuhost twin {twin.name}: sessions are chrooted into the twin's root
ListenAddress {twin.address}:22
HostKey {twin.host_key}
PidFile none
AuthorizedKeysFile {ssh / "authorized_keys"}
ChrootDirectory {twin.root}
Subsystem sftp internal-sftp
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
UseDNS no
PrintMotd no
PrintLastLog no
AcceptEnv LANG LC_*
MaxStartups 100:30:200
MaxSessions 100
"""


def _install_userland(twin: Twin) -> None:
    root = twin.root
    lib = root / "usr/lib/gpuhost-twin"
    lib.mkdir(parents=True, exist_ok=True)
    shutil.copy(SHIMS / "twinreq.py", lib / "twinreq.py")
    for name, where in (("reboot", "usr/local/sbin"), ("systemctl", "usr/local/bin")):
        (root / where).mkdir(parents=True, exist_ok=True)
        shutil.copy(SHIMS / name, root / where / name)
        (root / where / name).chmod(0o755)
    (root / "usr/local/sbin/shutdown").symlink_to("reboot")
    (root / "etc/hostname").write_text(twin.name + "\n")
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n{twin.address} {twin.name}\n")
    resolv = Path("/etc/resolv.conf")
    if resolv.exists():  # apt inside the twin resolves names like the machine does
        (root / "etc/resolv.conf").unlink(missing_ok=True)
        shutil.copy(resolv, root / "etc/resolv.conf")


def start(twin: Twin) -> None:
    """Spawn the twin's supervisor (detached); return when its sshd accepts connections."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), *sys.path]))
    with open(twin.dir / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "twin.supervisor", str(twin.dir)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # outlives the command that started it
            env=env,
            cwd="/",
        )
    (twin.dir / "supervisor.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + READY_TIMEOUT
    ready = twin.dir / "ready"
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (twin.dir / "supervisor.log").read_text(errors="replace")[-2000:]
            raise TwinError(f"{twin.name} did not come up; supervisor.log ends:\n{tail}")
        time.sleep(0.02)
    # The supervisor is a child of whoever started it; reap it in the background so it never
    # lingers as a zombie of a long-lived parent (pytest).
    import threading

    threading.Thread(target=proc.wait, daemon=True).start()


def start_fleet(count: int, profile: str | None, first: int = 1) -> list[Twin]:
    """Start twin<first>..twin<first+count-1> concurrently (skipping ones already running)."""
    check_machine()
    # fail early, once, on a bad profile; its Proxmox release picks the Debian base
    suite = load_profile(profile).debian_suite if profile is not None else rootfs.SUITE
    base = rootfs.ensure_base(suite=suite)
    ensure_fleet()
    _prune_bases(keep={base, *rootfs.current_bases(), *(Path(t.base) for t in list_twins())})
    twins = [Twin(twin_name(i), i, profile, str(base)) for i in range(first, first + count)]
    running = set()
    for t in list_twins():
        if t.name in {w.name for w in twins}:
            if is_up(t):
                running.add(t.name)
            else:
                stop(t.name)  # left by a crash or a machine reboot: start it afresh
    todo = [t for t in twins if t.name not in running]

    # Processes, not threads: installing the simulated hardware is CPU-bound Python. Twice the
    # cores, since each start also waits on its supervisor and sshd (8 kpro6 twins on 2 cores:
    # 15-17 s with one worker per core, 10-12 s with two).
    workers = max(1, min(len(todo), 2 * (os.cpu_count() or 1)))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        errors = [f.exception() for f in [pool.submit(_bring_up, t) for t in todo]]
    write_known_hosts()
    if any(errors):
        raise TwinError("; ".join(str(e) for e in errors if e))
    return [Twin.load(t.name) for t in twins]


def _bring_up(twin: Twin) -> None:
    try:
        create(twin)
        start(twin)
    except BaseException as exc:
        stop(twin.name)
        raise TwinError(f"{twin.name}: {exc}") from None  # picklable across the process pool


def stop(name: str) -> bool:
    """Stop a twin and remove it: supervisor, sshd, sessions, guests, mounts and state.

    False when there was no such twin."""
    tdir = STATE_ROOT / name
    if not tdir.exists():
        return False
    pidfile = tdir / "supervisor.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        if _is_supervisor(pid, tdir):
            os.kill(pid, signal.SIGTERM)  # it stops guests and sessions itself
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
    # Whatever is left (a supervisor that died, a stuck process) goes the hard way.
    from twin import guests

    guests.stop_all(tdir)
    kill_processes(tdir)
    unmount_below(tdir)
    shutil.rmtree(tdir)
    write_known_hosts()
    return True


def stop_all() -> list[str]:
    """Stop every twin; returns the names stopped."""
    names = [p.parent.name for p in STATE_ROOT.glob("*/twin.json")] if STATE_ROOT.is_dir() else []
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        list(pool.map(stop, names))
    return sorted(names, key=lambda n: (len(n), n))


# ---------------------------------------------------------------- processes and mounts


def is_up(twin: Twin) -> bool:
    """Its supervisor runs and has finished booting."""
    try:
        pid = int((twin.dir / "supervisor.pid").read_text())
    except (FileNotFoundError, ValueError):
        return False
    return (twin.dir / "ready").exists() and _alive(pid) and _is_supervisor(pid, twin.dir)


def answers_ssh(address: str, timeout: float = 2.0) -> bool:
    """Something on address:22 accepts a TCP connection and greets with an SSH banner."""
    try:
        with socket.create_connection((address, 22), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(256).startswith(b"SSH-")
    except OSError:
        return False


def state(twin: Twin) -> str:
    """'up', or 'down (why and what to do)': for `twin list`."""
    if not is_up(twin):
        return f"down (its supervisor is not running: python -m twin stop {twin.name})"
    if not answers_ssh(twin.address):
        return f"down (no SSH answer on {twin.address}:22; see {twin.dir / 'sshd.log'})"
    return "up"


def _is_supervisor(pid: int, tdir: Path) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    return b"twin.supervisor" in cmd and str(tdir).encode() in cmd


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    tmp.write_text(text)
    tmp.rename(path)
