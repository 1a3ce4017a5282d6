"""How gpuhost reaches a host's Proxmox API: address, node, and where the API token is.

The token itself is never in the inventory: only the name of the environment variable, or the
path of a file on the control machine, that holds it (gpuhost/pve/api.py reads and checks it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuhost.spec.values import AbsPath, DnsName, EnvName, Hostname


class ProxmoxApiSpec(BaseModel):
    """The host's Proxmox API (proxmoxer over https, an API token)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    address: Hostname | None = Field(
        None, description="API address; None: the host's SSH hostname."
    )
    port: int = Field(8006, ge=1, le=65535, description="API port (pveproxy).")
    node: DnsName | None = Field(
        None,
        description="The host's Proxmox node name; None: the only node the API lists (a "
        "cluster needs it set).",
    )
    token_env: EnvName = Field(
        "GPUHOST_PVE_TOKEN",
        description="Environment variable on the control machine that holds the API token as "
        "USER@REALM!TOKENID=SECRET. Read only when token_file is None.",
    )
    token_file: AbsPath | None = Field(
        None,
        description="File on the control machine holding the API token (one line "
        "USER@REALM!TOKENID=SECRET); it must be a regular file of mode 0600 or stricter.",
    )
