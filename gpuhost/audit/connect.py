"""How the audit reaches a host and its guests: testinfra's SSH backend with the host key verified
(or its local backend), wrapped as a plain command runner. Shared by the audit's pytest plugin and
`gpuhost metrics`."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuhost.audit.observe import Runner
from gpuhost.hostkeys import unknown_host_key
from gpuhost.spec.guests import LxcGuest


class UnknownHostKey(ValueError):
    """The host's key is not in known_hosts: nothing connects (the message says how to add it)."""


def testinfra_host(name: str, data: dict[str, Any], url: str) -> Any:
    import testinfra

    if url == "local://":
        return testinfra.get_host("local://")
    problem = unknown_host_key(name, data)
    if problem:
        raise UnknownHostKey(problem)
    extra = [
        "-o BatchMode=yes",
        f"-o StrictHostKeyChecking={data.get('ssh_strict_host_key_checking', 'yes')}",
    ]
    if data.get("ssh_known_hosts_file"):
        extra.append(f"-o UserKnownHostsFile={data['ssh_known_hosts_file']}")
    digest = hashlib.sha1(url.encode()).hexdigest()[:12]
    control = Path(tempfile.gettempdir()) / f"gpuhost-audit-{os.getuid()}-{digest}"
    return testinfra.get_host(
        url,
        ssh_identity_file=data.get("ssh_key"),
        ssh_extra_args=" ".join(extra),
        controlpath=str(control),
    )


def host_url(name: str, data: dict[str, Any]) -> str:
    hostname = str(data.get("ssh_hostname") or name)
    return f"ssh://{data.get('ssh_user') or 'root'}@{hostname}:{int(data.get('ssh_port') or 22)}"


def testinfra_runner(host: Any) -> Runner:
    def run(command: str) -> tuple[int, str, str]:
        try:
            result = host.run(command)
        except RuntimeError as exc:  # testinfra raises on exit status 255 (ssh's own, or pct's)
            result = exc.args[0]
            if not hasattr(result, "rc"):
                raise
        return result.rc, result.stdout, result.stderr

    return run


def host_runner(name: str, data: dict[str, Any], url: str | None = None) -> Runner:
    """The inventory host ``name``'s commands, at ``url`` (default: its inventory address; or
    local://). Raises UnknownHostKey before anything connects."""
    return testinfra_runner(testinfra_host(name, data, url or host_url(name, data)))


def guest_runners(name: str, data: dict[str, Any]) -> Callable[[LxcGuest], Runner]:
    """For the host ``name``: a guest with SSH of its own, reached at its access address with the
    host's key and known_hosts settings (the guest's own address is the one its key is looked up
    by). Raises UnknownHostKey when the guest's key is unknown, before anything connects."""

    def runner(guest: LxcGuest) -> Runner:
        access = guest.access
        url = f"ssh://{access.ssh_user}@{access.ssh_hostname}:{access.ssh_port}"
        guest_data = {**data, "ssh_hostname": access.ssh_hostname, "ssh_port": access.ssh_port}
        return host_runner(name, guest_data, url)

    return runner


def local_runner(command: str) -> tuple[int, str, str]:
    """``command`` on this machine, in bash as root's login shell on a Proxmox host runs it."""
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=False)
    return done.returncode, done.stdout, done.stderr
