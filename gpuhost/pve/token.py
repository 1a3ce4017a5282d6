"""The Proxmox API token on the control machine: from the environment or a 0600 file (the spec
names which, gpuhost/spec/proxmox.py), never from the inventory text, and never printed: errors
name the variable or file and the fix, not the value.

Apart from the API client (api.py) so that reading the token, which every deploy does before
anything changes (gpuhost/control.py), does not load requests and proxmoxer.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuhost.spec.proxmox import ProxmoxApiSpec

# pve-access-control: userid `name@realm`, token id `[A-Za-z][A-Za-z0-9._-]+`; secrets are UUIDs.
TOKEN_RE = re.compile(
    r"(?P<user>[^\s:/@!=]{1,60}@[A-Za-z][A-Za-z0-9._-]{1,31})!(?P<tokenid>[A-Za-z][A-Za-z0-9._-]{1,63})"
    r"=(?P<secret>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
)


class ApiTokenError(ValueError):
    """The API token is missing, malformed, or its file is readable by others."""


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
