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

import base64
import binascii
import re
from pathlib import PurePosixPath

from gpuhost.redact import is_secret_name, mask_secrets

REDACTED = "REDACTED"
_PRIVATE_DIRS = ("/etc/pve/priv/",)
_PRIVATE_SUFFIXES = (".key",)
# KEY=value, key: value or JSON's "key": "value", wherever it stands in a line (an LXC line
# `lxc.environment: TOKEN=x` holds one inside another); a value is quoted, or ends at
# whitespace, a comma or a semicolon.
_ENTRY = re.compile(
    r"(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)(?P<kq>[\"']?)(?P<sep>\s*[=:]\s*)"
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
        head, value = text[: match.start()], match["value"]
        key = f"{match['key']}{match['kq']}{match['sep']}"
        if is_secret_name(match["key"]):
            if value[0] in "\"'":  # a quoted value keeps its quotes (JSON, shell)
                return f"{head}{key}{value[0]}{REDACTED}{value[0]}{line_of(match['rest'])}"
            # `key: value` runs to the end of the line (a Proxmox or YAML option); KEY=value ends
            # where its value does
            rest = "" if ":" in match["sep"] else line_of(match["rest"])
            return f"{head}{key}{REDACTED}{rest}"
        # the value may hold entries of its own: `lxc.environment: API_TOKEN=...`
        return f"{head}{key}{line_of(value)}{line_of(match['rest'])}"

    return "\n".join(line_of(mask_secrets(line)) for line in text.split("\n"))


# Facts whose lines hold files (``F <path> <base64>``) and those whose lines are config text or
# process arguments (a guest's config, QEMU's argv in GuestStatuses).
_FILE_FACTS = ("ConfigFiles", "ModuleConfigFiles")
_TEXT_FACTS = ("PveGuestConfigs", "GuestStatuses")


def redact_snapshot(
    raw: dict[str, tuple[int, list[str]]],
) -> dict[str, tuple[int, list[str]]]:
    """A snapshot as kept beside a rehearsal: the same rule as for a profile. A secret file's
    line is left out, the other files and the guests' texts are redacted (a later rehearsal from
    it makes the same profile: the profile holds no secret either way). A file line that is not
    base64 text is left out too: what it holds cannot be checked."""
    kept = dict(raw)
    for key in _FILE_FACTS:
        if key not in raw:
            continue
        status, lines = raw[key]
        out = []
        for line in lines:
            kind, _, rest = line.partition(" ")
            path, _, value = rest.partition(" ")
            if secret_path(path):
                continue
            if kind == "F":
                try:
                    text = base64.b64decode(value, validate=True).decode()
                except (binascii.Error, UnicodeDecodeError):
                    continue
                line = f"F {path} {base64.b64encode(redact(text).encode()).decode()}"
            out.append(line)
        kept[key] = (status, out)
    for key in _TEXT_FACTS:
        if key in raw:
            status, lines = raw[key]
            kept[key] = (status, [redact(line) for line in lines])
    return kept
