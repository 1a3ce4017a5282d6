"""One twin: an overlay on the cached base, its own sshd on 127.0.0.N:22, and a supervisor.

This module knows a twin by its state (where it lives, its addresses and keys, whether it is up);
bringing twins up and down is twin/lifecycle.py.

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
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from twin.processes import _alive

STATE_ROOT = Path(os.environ.get("GPUHOST_TWIN_STATE", "/var/lib/gpuhost-twin"))
SHIMS = Path(__file__).parent / "shims"

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


# ---------------------------------------------------------------- liveness


def is_up(twin: Twin) -> bool:
    """Its supervisor runs and has finished booting."""
    try:
        pid = int((twin.dir / "supervisor.pid").read_text())
    except (FileNotFoundError, ValueError):
        return False
    return (twin.dir / "ready").exists() and _alive(pid) and is_supervisor(pid, twin.dir)


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


def is_supervisor(pid: int, tdir: Path) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    return b"twin.supervisor" in cmd and str(tdir).encode() in cmd


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    tmp.write_text(text)
    tmp.rename(path)
