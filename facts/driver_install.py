"""What the NVIDIA module deploy compares against: the installed modules' hashes, and what a
build on the host may use (cores, available memory)."""

from __future__ import annotations

import re
import shlex

from pyinfra.api import FactBase

from facts._parse import UnparsedOutput

# Written before modules are replaced, removed once depmod and the vermagic check passed: a run
# killed in between leaves it, and the next run installs again instead of trusting the hashes.
PENDING = ".gpuhost-pending"
_SHA_LINE = re.compile(r"^(?P<sha>[0-9a-f]{64})  (?P<path>/\S+)$")


def parse_module_hashes(lines: list[str]) -> dict[str, str]:
    """File name -> sha256 from ``sha256sum`` lines (no lines: no modules there)."""
    found = {}
    for line in lines:
        if not line.strip():
            continue
        if line.strip() == PENDING:
            found[PENDING] = ""
            continue
        match = _SHA_LINE.match(line)
        if not match:
            raise UnparsedOutput("installed module hashes", line)
        found[match["path"].rsplit("/", 1)[1]] = match["sha"]
    return found


class ModuleHashes(FactBase[dict[str, str]]):
    """
    Returns the sha256 of every ``*.ko`` in ``directory``, by file name:
    ``{"nvidia.ko": "3f2a...", "nvidia-uvm.ko": "..."}``; empty when there is none; with a
    ``.gpuhost-pending`` key when an install did not finish. One command for all of them, so a
    converged run compares locally.
    """

    default = dict

    def command(self, directory: str) -> str:
        quoted = shlex.quote(directory.rstrip("/"))
        return (
            f'for f in {quoted}/*.ko; do [ -f "$f" ] && sha256sum "$f"; done; '
            f"[ -e {quoted}/{PENDING} ] && echo {PENDING}; true"
        )

    def process(self, output: list[str]) -> dict[str, str]:
        return parse_module_hashes(output)


def parse_build_resources(lines: list[str]) -> tuple[int, int]:
    """(cores, MemAvailable in bytes) from ``nproc`` and /proc/meminfo's MemAvailable line."""
    text = [line.strip() for line in lines if line.strip()]
    if len(text) != 2 or not text[0].isdigit():
        raise UnparsedOutput("build resources", " | ".join(text), "want nproc, MemAvailable")
    match = re.fullmatch(r"MemAvailable:\s+(\d+) kB", text[1])
    if not match:
        raise UnparsedOutput("build resources", text[1], "not a MemAvailable line")
    return int(text[0]), int(match[1]) * 1024


class BuildResources(FactBase[tuple[int, int]]):
    """Returns ``(cores, MemAvailable bytes)``, e.g. ``(16, 134582738944)``: build jobs derive
    from both (gpuhost.toolchain.build_jobs), never from cores alone."""

    def command(self) -> str:
        return "nproc; grep '^MemAvailable:' /proc/meminfo"

    def process(self, output: list[str]) -> tuple[int, int]:
        return parse_build_resources(output)
