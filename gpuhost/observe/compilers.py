"""Which compiler built each installed kernel, and which compilers the host has.

Modules must be built by the compiler that built their kernel (a mismatch bricked a host,
docs/hazards.md). A kernel names its compiler in CONFIG_CC_VERSION_TEXT; its config is installed as
/boot/config-<release> and, with the headers, as /lib/modules/<release>/build/.config; some
kernels carry it only in /proc/config.gz (the running one, e.g. the H200 capture).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe

# Where a kernel's config is read from, in the order a choice prefers them: the config installed
# with the kernel image describes the kernel itself; the headers' copy is what Kbuild compiles
# against; /proc/config.gz only exists for the running kernel.
CONFIG_SOURCES = ("boot", "build", "proc")
_SECTION = re.compile(
    r"^== (?:(?P<kind>kernel) (?P<release>[^\s/]+) (?P<source>boot|build|proc)"
    r"|(?P<ckind>compiler) (?P<name>[A-Za-z0-9._+-]+) (?P<path>/\S*))$"
)
_CC_TEXT = re.compile(r'^CONFIG_CC_VERSION_TEXT=(?P<q>"?)(?P<text>.*)(?P=q)$')


@dataclass(frozen=True)
class CompilerInventory:
    """``kernels``: release -> config source ('boot', 'build', 'proc') -> CONFIG_CC_VERSION_TEXT
    (``{"6.8.12-9-pve": {"boot": "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"}}``; a config without
    the line maps to ""). ``compilers``: command -> first line of its ``--version``
    (``{"gcc-12": "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"}``)."""

    kernels: dict[str, dict[str, str]] = field(default_factory=dict)
    compilers: dict[str, str] = field(default_factory=dict)

    def kernel_compiler(self, release: str) -> str | None:
        """The kernel's CONFIG_CC_VERSION_TEXT from its preferred config; None when unknown."""
        sources = self.kernels.get(release, {})
        return next((sources[s] for s in CONFIG_SOURCES if sources.get(s)), None)


def parse_compilers(lines: list[str]) -> CompilerInventory:
    kernels: dict[str, dict[str, str]] = {}
    compilers: dict[str, str] = {}
    current: tuple[str, str, str] | None = None  # ("kernel", release, source) | ("compiler", name)
    for line in lines:
        if not line.strip():
            continue
        section = _SECTION.match(line)
        if section and section["kind"]:
            current = ("kernel", section["release"], section["source"])
            kernels.setdefault(section["release"], {})[section["source"]] = ""
            continue
        if section:
            current = ("compiler", section["name"], "")
            compilers[section["name"]] = ""
            continue
        if current is None:
            raise UnparsedOutput("kernel compilers", line, "line before any section")
        kind, name, source = current
        if kind == "kernel":
            text = _CC_TEXT.match(line.strip())
            if not text:
                raise UnparsedOutput("kernel compilers", line, "not a CONFIG_CC_VERSION_TEXT line")
            kernels[name][source] = text["text"]
        elif not compilers[name]:
            compilers[name] = line.strip()  # the first line of --version names the compiler
        else:
            raise UnparsedOutput("kernel compilers", line, f"second line for compiler {name}")
    return CompilerInventory(kernels=kernels, compilers=compilers)


class KernelCompilers(Probe[CompilerInventory]):
    """
    Returns a :class:`CompilerInventory`: for each installed kernel the compiler in its config
    (CONFIG_CC_VERSION_TEXT, quoted or not) per config file, and the first ``--version`` line
    of every ``gcc``, ``cc`` and ``gcc-N`` on the PATH. Absent files and compilers are simply not
    listed; the command always exits 0.
    """

    default = CompilerInventory

    def command(self) -> str:
        cc_line = "grep -m1 '^CONFIG_CC_VERSION_TEXT=' \"$f\" 2>/dev/null"
        return (
            'for f in /boot/config-*; do [ -f "$f" ] || continue; '
            f'echo "== kernel ${{f#/boot/config-}} boot"; {cc_line}; done; '
            'for d in /lib/modules/*/; do f="${d}build/.config"; [ -f "$f" ] || continue; '
            f'k=${{d%/}}; echo "== kernel ${{k##*/}} build"; {cc_line}; done; '
            'if [ -r /proc/config.gz ]; then echo "== kernel $(uname -r) proc"; '
            "zcat /proc/config.gz 2>/dev/null | grep -m1 '^CONFIG_CC_VERSION_TEXT='; fi; "
            'for c in gcc cc $(IFS=:; for d in $PATH; do ls "$d" 2>/dev/null; done '
            "| grep -xE 'gcc-[0-9]+' | sort -u); do p=$(command -v \"$c\") || continue; "
            'echo "== compiler $c $p"; "$c" --version 2>/dev/null | head -n 1; done; true'
        )

    def process(self, output: list[str]) -> CompilerInventory:
        return parse_compilers(output)
