"""A build host for the tests: this machine, reached over real SSH through its own throwaway sshd
on 127.0.0.1 (a fresh host key, a fresh client key, key-only root login), so `gpuhost build`
and the deploys talk to it exactly as to a remote build host. ``path`` puts directories before
the default PATH of its sessions (the tests' compiler wrapper) and ``env`` sets more variables
there (the wrapper's log), through sshd's SetEnv."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin") or "/usr/sbin/sshd"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class LocalBuildHost:
    port: int
    key: Path  # the client's private key
    known_hosts: Path

    def host_data(self) -> dict[str, object]:
        """pyinfra host data for gpuhost.spec.inventory.build_host()."""
        return {
            "ssh_hostname": "127.0.0.1",
            "ssh_port": self.port,
            "ssh_user": "root",
            "ssh_key": str(self.key),
            "ssh_known_hosts_file": str(self.known_hosts),
        }

    def entry(self, name: str) -> str:
        """The inventory line that declares it as ``name`` (an identifier: also the variable)."""
        return f"{name} = build_host({name!r}, **{self.host_data()!r})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_build_host(
    where: Path, path: list[Path] | None = None, env: dict[str, str] | None = None
) -> Iterator[LocalBuildHost]:
    where.mkdir(parents=True, exist_ok=True)
    for name in ("host_ed25519", "client_ed25519"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(where / name)], check=True
        )
    shutil.copyfile(where / "client_ed25519.pub", where / "authorized_keys")
    port = free_port()
    host_key = (where / "host_ed25519.pub").read_text().split()[:2]
    (where / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_key)}\n")
    session_path = ":".join([*map(str, path or []), DEFAULT_PATH])
    (where / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {where / 'host_ed25519'}\n"
        f"PidFile {where / 'sshd.pid'}\nAuthorizedKeysFile {where / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "Subsystem sftp internal-sftp\n"
        "SetEnv "
        + " ".join(f"{k}={v}" for k, v in {"PATH": session_path, **(env or {})}.items())
        + "\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = (where / "sshd.log").open("w")
    sshd = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(where / "sshd_config")], stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if sshd.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sshd did not start: {(where / 'sshd.log').read_text()}"
                    ) from None
                time.sleep(0.05)
        yield LocalBuildHost(port, where / "client_ed25519", where / "known_hosts")
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)
        log.close()
