"""Bringing twins up and down: what the machine needs, the fleet's client key, creating a twin
(overlay, sshd config, shims, simulated hardware and Proxmox), starting its supervisor, stopping
and removing it with its guests. What a twin is and where it lives is twin/node.py."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

from twin import node, rootfs
from twin.errors import TwinError
from twin.mounts import mount_overlay, unmount_below
from twin.node import Twin
from twin.processes import _alive, kill_processes, port_22_problem

# ---------------------------------------------------------------- fleet-wide


# What starting a twin needs on the machine (gpuhost-twin/twin/APT_PACKAGES installs them).
TOOLS = ("debootstrap", "sshd", "ssh-keygen", "ssh", "lxc-start", "lxc-attach", "mount", "unshare")
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INSTALL_HINT = "apt-get install $(grep -v '^#' gpuhost-twin/twin/APT_PACKAGES)"
READY_TIMEOUT = 30.0  # seconds a started twin has to report ready


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
    node.STATE_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    rootfs.check_chroot_safe(node.STATE_ROOT)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd refuses to start without it
    key = node.client_key()
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


def _prune_bases(keep: set[Path]) -> None:
    """Bases of older recipes take ~0.5 GB each; drop those no running twin stands on."""
    for old in rootfs.CACHE_ROOT.glob("base-*"):
        if old.is_dir() and old not in keep and not old.name.endswith(".building"):
            shutil.rmtree(old)


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
    shutil.copy(node.client_key().with_suffix(".pub"), twin.dir / "ssh" / "authorized_keys")
    (twin.dir / "ssh" / "sshd_config").write_text(_sshd_config(twin))
    _install_userland(twin)
    if twin.profile is not None:
        from twin import hardware, pve  # the hardware and Proxmox helpers' modules

        profile = node.load_profile(twin.profile)
        hardware.install(twin.root, profile)
        pve.install(twin.root, profile)
        if profile.start is not None:  # made from a capture: the host's software as read
            from twin import startstate

            startstate.install(twin.root, profile)
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
    for name in ("twinreq.py", "unitexec.py"):  # imported by the shims
        shutil.copy(node.SHIMS / name, lib / name)
    for name, where in (("reboot", "usr/local/sbin"), ("systemctl", "usr/local/bin")):
        (root / where).mkdir(parents=True, exist_ok=True)
        shutil.copy(node.SHIMS / name, root / where / name)
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
    return start_profiles([profile] * count, first)


def start_profiles(profiles: list[str | None], first: int = 1) -> list[Twin]:
    """Start twin<first>.. concurrently, one per profile (skipping ones already running)."""
    check_machine()
    # fail early, once, on a bad profile; its Proxmox release picks the Debian base
    suites = {
        p: node.load_profile(p).debian_suite if p is not None else rootfs.SUITE
        for p in set(profiles)
    }
    bases = {suite: rootfs.ensure_base(suite=suite) for suite in set(suites.values())}
    ensure_fleet()
    keep = {*bases.values(), *rootfs.current_bases(), *(Path(t.base) for t in node.list_twins())}
    _prune_bases(keep=keep)
    twins = [
        Twin(node.twin_name(i), i, p, str(bases[suites[p]])) for i, p in enumerate(profiles, first)
    ]
    running = set()
    for t in node.list_twins():
        if t.name in {w.name for w in twins}:
            if node.is_up(t):
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
    node.write_known_hosts()
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
    tdir = node.STATE_ROOT / name
    if not tdir.exists():
        return False
    pidfile = tdir / "supervisor.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        if node.is_supervisor(pid, tdir):
            os.kill(pid, signal.SIGTERM)  # it stops guests and sessions itself
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
    # Whatever is left (a supervisor that died, a stuck process) goes the hard way. Imported
    # here: guests loads the Proxmox simulation (~25 modules, 0.2-0.4 s here), which the pytest
    # plugin, loaded by every pytest run, should not pay for.
    from twin import guests

    guests.stop_all(tdir)
    kill_processes(tdir)
    unmount_below(tdir)
    shutil.rmtree(tdir)
    node.write_known_hosts()
    return True


def stop_all() -> list[str]:
    """Stop every twin; returns the names stopped."""
    root = node.STATE_ROOT
    names = [p.parent.name for p in root.glob("*/twin.json")] if root.is_dir() else []
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        list(pool.map(stop, names))
    return sorted(names, key=lambda n: (len(n), n))
