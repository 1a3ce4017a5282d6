"""The host's Proxmox API through proxmoxer: the API token, a verified TLS connection, tasks.

The token comes from the environment or a 0600 file on the control machine (the spec names
which, gpuhost/spec/proxmox.py), never from the inventory text, and is never printed: errors
name the variable or file and the fix, not the value. TLS is verified against the cluster CA
(/etc/pve/pve-root-ca.pem) as read over the deploy's SSH connection, whose host key is checked,
so the API is trusted exactly as far as SSH is, without the user copying certificates around.

The calls gpuhost makes through the token (PCI mappings, a VM's config PUT) are synchronous;
guests are stopped and started by Proxmox's stopall/startall as root over SSH (pvesh waits for
those tasks itself), so no task polling is needed here.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from gpuhost.spec.proxmox import ProxmoxApiSpec

# pve-access-control: userid `name@realm`, token id `[A-Za-z][A-Za-z0-9._-]+`; secrets are UUIDs.
TOKEN_RE = re.compile(
    r"(?P<user>[^\s:/@!=]{1,60}@[A-Za-z][A-Za-z0-9._-]{1,31})!(?P<tokenid>[A-Za-z][A-Za-z0-9._-]{1,63})"
    r"=(?P<secret>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
)


class ApiTokenError(ValueError):
    """The API token is missing, malformed, or its file is readable by others."""


class PveApiError(RuntimeError):
    """An API call or a task failed; the message is Proxmox's own text (never the token)."""


@dataclass(frozen=True)
class ApiToken:
    user: str  # root@pam
    tokenid: str  # gpuhost
    secret: str = field(repr=False)

    @property
    def identity(self) -> str:
        return f"{self.user}!{self.tokenid}"


def parse_token(text: str, where: str) -> ApiToken:
    match = TOKEN_RE.fullmatch(text.strip())
    if match is None:
        raise ApiTokenError(
            f"{where} does not hold an API token of the form USER@REALM!TOKENID=SECRET (the "
            "secret a UUID, as `pveum user token add` prints it); fix its content"
        )
    return ApiToken(match["user"], match["tokenid"], match["secret"])


def read_token(spec: ProxmoxApiSpec, environ: Mapping[str, str] | None = None) -> ApiToken:
    """The token from ``proxmox.token_file`` (mode 0600 or stricter) or ``proxmox.token_env``."""
    if spec.token_file is not None:
        path = Path(spec.token_file)
        where = f"proxmox.token_file {spec.token_file}"
        try:
            info = path.stat()
        except OSError as exc:
            raise ApiTokenError(f"{where} cannot be read ({exc.strerror}); create it") from None
        if not stat.S_ISREG(info.st_mode):
            raise ApiTokenError(f"{where} is not a regular file")
        if info.st_mode & 0o077:
            raise ApiTokenError(
                f"{where} has mode {stat.S_IMODE(info.st_mode):04o}; others may read the "
                f"token: chmod 600 {spec.token_file}"
            )
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:  # mode 0600 but owned by another user, say
            raise ApiTokenError(
                f"{where} cannot be read ({exc.strerror}); make it readable (mode 0600) by the "
                "user that runs gpuhost"
            ) from None
        return parse_token(text, where)
    environ = os.environ if environ is None else environ
    value = environ.get(spec.token_env)
    if not value:
        raise ApiTokenError(
            f"the API token is not set: export {spec.token_env}=USER@REALM!TOKENID=SECRET on the "
            "control machine, or set proxmox.token_file to a 0600 file holding it"
        )
    return parse_token(value, f"environment variable {spec.token_env}")


@dataclass
class PveApi:
    """One host's API: the proxmoxer client, the node name, and the CA file it verifies with."""

    client: Any  # ProxmoxAPI
    node: str
    identity: str  # the token id, the caller Proxmox sees
    ca_file: str

    def call(self, method: str, path: str, **params: Any) -> Any:
        """``call("put", "/nodes/kpro6/qemu/129/config", hostpci0=...)``; errors as PveApiError."""
        resource = self.client(path.strip("/"))
        try:
            return getattr(resource, method)(**params)
        except ResourceException as exc:
            raise PveApiError(_describe(method, path, exc)) from None
        except requests.RequestException as exc:  # TLS, refused, timeout: never the headers
            raise PveApiError(
                f"{method.upper()} {path}: cannot reach the API ({type(exc).__name__}); check "
                "proxmox.address/port and that pveproxy runs"
            ) from None


def _describe(method: str, path: str, exc: ResourceException) -> str:
    errors = getattr(exc, "errors", None) or {}
    detail = "; ".join(f"{k}: {str(v).strip()}" for k, v in sorted(errors.items()))
    reason = getattr(exc, "status_message", "") or str(exc)
    return f"{method.upper()} {path}: {exc.status_code} {reason}" + (
        f" ({detail})" if detail else ""
    )


def connect(
    spec: ProxmoxApiSpec,
    ssh_hostname: str,
    ca_pem: str | None,
    environ: Mapping[str, str] | None = None,
) -> PveApi:
    """A verified connection to the host's API; the node from the spec, else the only node."""
    if not ca_pem or "BEGIN CERTIFICATE" not in ca_pem:
        raise PveApiError(
            "the host has no /etc/pve/pve-root-ca.pem to verify its API certificate against; "
            "is this a Proxmox VE host (pve-cluster running)?"
        )
    token = read_token(spec, environ)
    handle, ca_file = tempfile.mkstemp(prefix="gpuhost-pve-ca-", suffix=".pem")
    with os.fdopen(handle, "w") as f:
        f.write(ca_pem)
    client = ProxmoxAPI(
        spec.address or ssh_hostname,
        port=spec.port,
        user=token.user,
        token_name=token.tokenid,
        token_value=token.secret,
        verify_ssl=ca_file,
        timeout=30,
    )
    api = PveApi(client, spec.node or "", token.identity, ca_file)
    if not api.node:
        nodes = [n["node"] for n in api.call("get", "/nodes")]
        if len(nodes) != 1:
            raise PveApiError(
                f"the API lists {len(nodes)} nodes ({', '.join(sorted(nodes))}); set "
                "proxmox.node to this host's node name"
            )
        api.node = nodes[0]
    return api
