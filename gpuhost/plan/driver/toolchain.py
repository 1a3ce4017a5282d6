"""The one toolchain: which compiler may build modules for a kernel, and how many jobs fit.

A module built by another GCC than its kernel's can crash the host (docs/hazards.md), so the choice is
strict: the compiler must be GCC of the kernel's exact version (X.Y.Z). The distribution's
package revision ("12.2.0-14" vs "12.2.0-14+deb12u1") is not compared: Kbuild's own check and
the audit's driver.compiler compare the version, and the kernel config often names the plain
``gcc`` while the host calls it ``gcc-12``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1 << 30
# Memory one parallel job may take: a C/Kbuild job (the NVIDIA modules' largest files) stays
# well under 1 GiB; nvcc jobs (flash-attn) took several GiB each and ran hosts out of memory
# with MAX_JOBS=128 (docs/hazards.md). Reserve is left for the host's own services and guests.
PER_JOB_BYTES = {"c": 1 * GIB, "nvcc": 4 * GIB}
RESERVE_BYTES = 2 * GIB

# "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0", "gcc (GCC) 15.3.0", "cc (Ubuntu 13.3.0-6) 13.3.0",
# the .comment of an object "GCC: (Debian 12.2.0-14+deb12u1) 12.2.0", /proc/version's
# "gcc version 15.3.0 (GCC)".
_VERSION_LINE = re.compile(
    r"^(?P<name>[A-Za-z0-9_.+-]+?)(?::)? (?:\((?P<vendor>[^)]*)\) )?(?P<version>\d+\.\d+\.\d+)\b"
)
_GCC_VERSION_WORDS = re.compile(r"^gcc version (?P<version>\d+\.\d+\.\d+)\b")
_GCC_NAMES = re.compile(r"(?:[\w-]+-)?(?:gcc|cc|GCC)(?:-\d+)?")


class ToolchainError(ValueError):
    """A compiler string that is not understood, or no compiler that may build a module."""


@dataclass(frozen=True)
class Compiler:
    name: str  # "gcc" for every GCC driver name (gcc, gcc-12, cc, x86_64-linux-gnu-gcc-12)
    version: str  # "12.2.0"


def parse_compiler(text: str) -> Compiler:
    """The compiler family and version of a CONFIG_CC_VERSION_TEXT, a ``--version`` first line,
    an object's .comment (``GCC: (...) X.Y.Z``) or /proc/version's ``gcc version X.Y.Z``."""
    line = text.strip().strip('"')
    words = _GCC_VERSION_WORDS.match(line)
    if words:
        return Compiler("gcc", words["version"])
    match = _VERSION_LINE.match(line)
    if not match:
        raise ToolchainError(f"not a compiler version string: {text!r}")
    name = match["name"]
    if _GCC_NAMES.fullmatch(name):
        return Compiler("gcc", match["version"])
    if name.endswith("clang") or "clang" in (match["vendor"] or ""):
        return Compiler("clang", match["version"])
    raise ToolchainError(f"unknown compiler {name!r} in {text!r}")


@dataclass(frozen=True)
class CompilerChoice:
    """The command to build with, or why none may (``refusal``, naming both compilers)."""

    command: str | None
    kernel_compiler: str
    compiler_text: str | None = None  # the chosen command's --version line
    refusal: str | None = None


def choose_module_compiler(kernel_cc_text: str, available: dict[str, str]) -> CompilerChoice:
    """Pick, among ``available`` (command -> ``--version`` first line), a compiler of the kernel's
    family and exact version; prefer the versioned name (``gcc-12``): it keeps meaning the same
    compiler when the distribution's default ``gcc`` moves on."""
    wanted = parse_compiler(kernel_cc_text)
    matching = []
    for command, line in available.items():
        try:
            found = parse_compiler(line)
        except ToolchainError:
            continue  # a wrapper that prints something else is not a compiler we can vouch for
        if found == wanted:
            matching.append(command)
    if matching:
        best = sorted(matching, key=lambda c: (not re.fullmatch(r"gcc-\d+", c), c))[0]
        return CompilerChoice(best, kernel_cc_text, available[best])
    have = "; ".join(f"{c}: {line!r}" for c, line in sorted(available.items())) or "none"
    major = wanted.version.split(".")[0]
    return CompilerChoice(
        None,
        kernel_cc_text,
        refusal=(
            f"the kernel was built by {kernel_cc_text!r} but the host's compilers are {have}; "
            f"modules built by another compiler must not be loaded into it. Install "
            f"{wanted.name}-{major} {wanted.version} (e.g. the distribution's {wanted.name}-{major} "
            "package) or build on a machine that has it"
        ),
    )


def build_jobs(cores: int, mem_available_bytes: int, kind: str = "c") -> int:
    """Parallel jobs for a build: never more than the cores, never more than the memory left
    after the reserve allows (``PER_JOB_BYTES[kind]`` each), and at least one."""
    if kind not in PER_JOB_BYTES:
        raise ToolchainError(f"unknown build kind {kind!r}; use one of {sorted(PER_JOB_BYTES)}")
    by_memory = (mem_available_bytes - RESERVE_BYTES) // PER_JOB_BYTES[kind]
    return max(1, min(cores, by_memory))
