"""The Proxmox API as root over SSH (`pvesh`), through proxmoxer, with the host key verified.

proxmoxer has two SSH backends and neither fits as shipped: its openssh backend needs
openssh-wrapper 0.4, which imports `pipes` (removed in Python 3.13, the Python of Debian 13), and
its paramiko backend accepts any host key (paramiko.AutoAddPolicy in SshParamikoSession._connect).
So the session here is proxmoxer's paramiko session with its connect step replaced: the
inventory's known_hosts (or the user's) is loaded and an unknown or changed key is refused
(paramiko.RejectPolicy); everything else (pvesh command lines, JSON decoding, errors as
ResourceException) is proxmoxer's own.
"""

from __future__ import annotations

import os

import paramiko
from proxmoxer.backends.command_base import CommandBaseBackend, JsonSimpleSerializer
from proxmoxer.backends.ssh_paramiko import SshParamikoSession
from proxmoxer.core import ProxmoxResource


class VerifiedSession(SshParamikoSession):
    """proxmoxer's paramiko session, refusing any host key the known_hosts files lack."""

    def __init__(
        self,
        host: str,
        user: str,
        known_hosts: str | None = None,
        private_key_file: str | None = None,
        port: int = 22,
        timeout: int = 30,
    ) -> None:
        self.known_hosts = known_hosts
        super().__init__(host, user, private_key_file=private_key_file, port=port, timeout=timeout)

    def _connect(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if self.known_hosts:  # the inventory's file: the one pyinfra verifies the host with
            client.load_host_keys(os.path.expanduser(self.known_hosts))
        else:
            client.load_system_host_keys()  # ~/.ssh/known_hosts, as ssh would
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        key = os.path.expanduser(self.private_key_file) if self.private_key_file else None
        client.connect(
            self.host,
            port=self.port,
            username=self.user,
            key_filename=key,
            look_for_keys=key is None,
            allow_agent=True,
            timeout=self.timeout,
        )
        return client


def pve_over_ssh(
    host: str,
    user: str = "root",
    port: int = 22,
    known_hosts: str | None = None,
    private_key_file: str | None = None,
    timeout: int = 30,
) -> ProxmoxResource:
    """The API root (``api.nodes.get()`` ...) of ``host``, run as ``pvesh`` over verified SSH."""
    backend = CommandBaseBackend()
    backend.session = VerifiedSession(host, user, known_hosts, private_key_file, port, timeout)
    backend.target = host
    return ProxmoxResource(
        base_url=backend.get_base_url(),
        session=backend.get_session(),
        serializer=JsonSimpleSerializer(),
    )
