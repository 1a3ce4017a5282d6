"""Contents of the configuration files gpuhost manages, read in one command."""

from __future__ import annotations

import re

from pyinfra.api import FactBase

from facts._parse import UnparsedOutput

# Every file a deploy writes or edits. Owned drop-ins are named gpuhost-*; shared files
# (/etc/kernel/cmdline, /etc/default/grub) are edited in place, keeping the user's content.
MANAGED_PATHS = (
    "/etc/kernel/cmdline",
    "/etc/default/grub",
    "/etc/modprobe.d/gpuhost-*.conf",
    "/etc/modules-load.d/gpuhost-*.conf",
)
_HEADER = re.compile(r"^==> (?P<path>/\S+) <==$")


def parse_config_files(lines: list[str]) -> dict[str, str]:
    files: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines:
        header = _HEADER.match(line)
        if header:
            current = files.setdefault(header["path"], [])
        elif current is None:
            raise UnparsedOutput("config files", line, "line before any file header")
        else:
            current.append(line)
    return {path: "".join(f"{line}\n" for line in body) for path, body in files.items()}


class ConfigFiles(FactBase[dict[str, str]]):
    """
    Returns path -> content of the files gpuhost manages that exist now (absent files are
    missing from the dict). Content is normalised to end with one newline per line.
    """

    default = dict

    def command(self) -> str:
        return (
            f'for f in {" ".join(MANAGED_PATHS)}; do [ -f "$f" ] || continue; '
            'echo "==> $f <=="; cat "$f"; done'
        )

    def process(self, output: list[str]) -> dict[str, str]:
        return parse_config_files(output)


class BootId(FactBase[str]):
    """Returns this boot's id (``/proc/sys/kernel/random/boot_id``): a reboot changes it."""

    def command(self) -> str:
        return "cat /proc/sys/kernel/random/boot_id"

    def process(self, output: list[str]) -> str:
        value = "".join(output).strip()
        if not re.fullmatch(r"[0-9a-f-]{36}", value):
            raise UnparsedOutput("boot_id", value)
        return value
