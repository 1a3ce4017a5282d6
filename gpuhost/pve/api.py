"""The host's Proxmox API through proxmoxer: a verified TLS connection with the API token
(read by gpuhost/pve/token.py, never printed), the calls, tasks.

TLS is verified against the cluster CA
(/etc/pve/pve-root-ca.pem) as read over the deploy's SSH connection, whose host key is checked,
so the API is trusted exactly as far as SSH is, without the user copying certificates around.

The calls gpuhost makes through the token (PCI mappings, a VM's config PUT) are synchronous;
guests are stopped and started by Proxmox's stopall/startall as root over SSH (pvesh waits for
those tasks itself), so no task polling is needed here.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import requests
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from gpuhost.pve.token import read_token
from gpuhost.spec.proxmox import ProxmoxApiSpec


class PveApiError(RuntimeError):
    """An API call or a task failed; the message is Proxmox's own text (never the token)."""


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
    """``POST /cluster/mapping/pci: 500 create hardware mapping failed: ...``: pveproxy sends
    the handler's message as the HTTP reason, which proxmoxer keeps as ``content`` (its
    ``status_message`` is only the code's standard phrase, "Internal Server Error")."""
    errors = getattr(exc, "errors", None)
    errors = errors if isinstance(errors, dict) else {}
    detail = "; ".join(f"{k}: {str(v).strip()}" for k, v in sorted(errors.items()) if v)
    phrase = getattr(exc, "status_message", "") or ""
    content = str(getattr(exc, "content", "") or "").strip()
    reason = content if content and content != phrase else phrase or str(exc)
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
