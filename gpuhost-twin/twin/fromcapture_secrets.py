"""What of a capture may enter a twin profile: secrets never do (issue 25, item 5).

A file is left out whole when its path names a secret: a secret word in its file name
(gpuhost.redact.is_secret_name: token, password, secret, credential, api key, private), a
private key (``*.key``), or anything under Proxmox's private directory ``/etc/pve/priv/`` (API
token secrets, authkeys). Inside the files kept and inside guest configs, an entry
``KEY=value`` or ``key: value`` whose key names a secret keeps its key and loses its value
(:data:`REDACTED`), so the file still parses and the twin still sees that the key is set;
credentials inside URLs become ``***`` (gpuhost.redact.mask_secrets).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from gpuhost.redact import is_secret_name, mask_secrets

REDACTED = "REDACTED"
_PRIVATE_DIRS = ("/etc/pve/priv/",)
_PRIVATE_SUFFIXES = (".key",)
# KEY=value or key: value, wherever it stands in a line (an LXC line `lxc.environment: TOKEN=x`
# holds one inside another); a value is quoted, or ends at whitespace, a comma or a semicolon.
_ENTRY = re.compile(
    r"(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>\s*[=:]\s*)"
    r"(?P<value>\"[^\"]*\"?|'[^']*'?|[^\s,;]+)(?P<rest>.*)$"
)


def secret_path(path: str) -> bool:
    """Whether a file at ``path`` is a secret as a whole (never copied into a profile)."""
    name = PurePosixPath(path).name
    return (
        path.startswith(_PRIVATE_DIRS)
        or name.endswith(_PRIVATE_SUFFIXES)
        or is_secret_name(name)
        or is_secret_name(str(PurePosixPath(path).parent))
    )


def redact(text: str) -> str:
    """``text`` with the value of every secret-named entry replaced by :data:`REDACTED`."""

    def line_of(text: str) -> str:
        match = _ENTRY.search(text)
        if match is None:
            return text
        head, key, sep = text[: match.start()], match["key"], match["sep"]
        if is_secret_name(key):
            # `key: value` runs to the end of the line (a Proxmox or YAML option); KEY=value ends
            # where its value does
            rest = "" if ":" in sep else line_of(match["rest"])
            return f"{head}{key}{sep}{REDACTED}{rest}"
        # the value may hold entries of its own: `lxc.environment: API_TOKEN=...`
        return f"{head}{key}{sep}{line_of(match['value'])}{line_of(match['rest'])}"

    return "\n".join(line_of(mask_secrets(line)) for line in text.split("\n"))
