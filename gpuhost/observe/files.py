"""The files gpuhost manages, read in one command: contents, symlinks, and gpuhost's own records."""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe
from gpuhost.paths import MANAGED_PATHS

_LINE = re.compile(r"(?P<kind>[FL]) (?P<path>/\S+) (?P<value>\S*)")


@dataclass(frozen=True)
class ManagedFiles:
    files: dict[str, str] = field(default_factory=dict)  # path -> text of regular files
    links: dict[str, str] = field(default_factory=dict)  # path -> symlink target


def parse_managed_files(lines: list[str]) -> ManagedFiles:
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    for line in lines:
        match = _LINE.fullmatch(line)
        if not match:
            raise UnparsedOutput("managed files", line)
        if match["kind"] == "L":
            links[match["path"]] = match["value"]
            continue
        try:
            files[match["path"]] = base64.b64decode(match["value"], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise UnparsedOutput("managed files", line, f"not base64 text: {exc}") from None
    return ManagedFiles(files, links)


def read_files_command(paths: tuple[str, ...]) -> str:
    """One line per existing path or glob match: ``F <path> <base64 content>`` or ``L <path>
    <target>`` (parse_managed_files reads it back); absent paths print nothing."""
    return (
        f"for f in {' '.join(paths)}; do "
        'if [ -L "$f" ]; then echo "L $f $(readlink "$f")"; '
        'elif [ -f "$f" ]; then echo "F $f $(base64 -w0 <"$f")"; fi; done'
    )


class ConfigFiles(Probe[ManagedFiles]):
    """
    Returns the files gpuhost manages that exist now: ``files`` (path -> text, exactly as on
    disk) and ``links`` (path -> symlink target). Absent paths are in neither. One line per
    path: ``F <path> <base64 content>`` or ``L <path> <target>``, so any content survives.
    """

    default = ManagedFiles

    def command(self) -> str:
        return read_files_command(MANAGED_PATHS)

    def process(self, output: list[str]) -> ManagedFiles:
        return parse_managed_files(output)


# Every file kmod and systemd-modules-load read from /etc, gpuhost's or not: modprobe.d options
# and blacklists of the user or a driver package, modules loaded at boot (kmod's libkmod-config.c
# reads /etc/modprobe.d/*.conf; modules-load.d(5) /etc/modules-load.d/*.conf; Debian's kmod reads
# /etc/modules too). gpuhost never writes these; a capture keeps them so that a twin made from
# it (gpuhost rehearse) loads its modules with the host's options.
MODULE_CONFIG_PATHS = ("/etc/modprobe.d/*.conf", "/etc/modules-load.d/*.conf", "/etc/modules")


class ModuleConfigFiles(Probe[ManagedFiles]):
    """
    Returns every module configuration file in /etc (:data:`MODULE_CONFIG_PATHS`) as
    :class:`ManagedFiles`: ``files`` path -> text, ``links`` path -> target.
    """

    default = ManagedFiles

    def command(self) -> str:
        return read_files_command(MODULE_CONFIG_PATHS)

    def process(self, output: list[str]) -> ManagedFiles:
        return parse_managed_files(output)


class BootId(Probe[str]):
    """Returns this boot's id (``/proc/sys/kernel/random/boot_id``): a reboot changes it."""

    def command(self) -> str:
        return "cat /proc/sys/kernel/random/boot_id"

    def process(self, output: list[str]) -> str:
        value = "".join(output).strip()
        if not re.fullmatch(r"[0-9a-f-]{36}", value):
            raise UnparsedOutput("boot_id", value)
        return value
