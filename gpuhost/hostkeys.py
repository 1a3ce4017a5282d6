"""Is a host's SSH key known before gpuhost connects? Host keys are verified, never added.

pyinfra with ``ssh_strict_host_key_checking="yes"`` (what ``gpu_host()`` sets) refuses an
unknown key with "StrictPolicy: No host key for HOST found in known_hosts"; this says the same
before any connection, with the way to add the key.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from pathlib import Path
from typing import Any

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def unknown_host_key(name: str, data: dict[str, Any]) -> str | None:
    """Why ``name`` (pyinfra host data ``data``) would be refused for its host key, or None."""
    if data.get("ssh_strict_host_key_checking", "yes") != "yes" or name.startswith("@"):
        return None
    import paramiko

    hostname = str(data.get("ssh_hostname") or name)
    port = int(data.get("ssh_port") or 22)
    shown = str(data.get("ssh_known_hosts_file") or DEFAULT_KNOWN_HOSTS)
    path = Path(os.path.expanduser(shown))
    entry = hostname if port == 22 else f"[{hostname}]:{port}"
    keys = paramiko.HostKeys()
    if path.is_file():
        with contextlib.suppress(OSError, paramiko.SSHException):
            keys.load(str(path))
    if keys.lookup(entry):
        return None
    scan = f"ssh-keyscan -H {f'-p {port} ' if port != 22 else ''}{shlex.quote(hostname)}"
    return (
        f"{name}: no host key for {entry} in {shown}, and gpuhost verifies host keys; check the "
        f"host's fingerprint (on its console: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), "
        f"then add it: {scan} >> {shown}, or connect once with ssh and accept it"
    )
