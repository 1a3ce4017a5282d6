"""Building the NVIDIA open kernel modules for one kernel, with one named compiler.

NVIDIA's open-gpu-kernel-modules tree builds with ``make modules SYSSRC=<kernel build dir>
CC=<compiler> -j N`` and leaves its modules in ``kernel-open/``. The same command runs on a
build host (``build_modules`` here) or on the target through the deploy (``build_command``), so
what is built is the same either way; what a build produced is read back from the modules
themselves (vermagic, version, the compiler in their .comment section), never assumed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm")
_VERSION = re.compile(r"^NVIDIA_VERSION\s*[:?]?=\s*(?P<version>\S+)\s*$", re.M)
_COMMENT_GCC = re.compile(rb"GCC: \(([^)]*)\) ([0-9][0-9.]*)")


class DriverBuildError(RuntimeError):
    """The module build failed; the message carries the build's own output."""


def source_version(tree: Path) -> str:
    """The driver version a source tree builds (its version.mk)."""
    match = _VERSION.search((tree / "version.mk").read_text())
    if not match:
        raise DriverBuildError(f"{tree}/version.mk: no NVIDIA_VERSION line")
    return match["version"]


def build_command(tree: str, kernel_build: str, cc: str, jobs: int) -> str:
    """The one build command, quoted for a shell (local or remote)."""
    return (
        f"make -C {shlex.quote(tree)} modules SYSSRC={shlex.quote(kernel_build)} "
        f"CC={shlex.quote(cc)} -j{int(jobs)}"
    )


@dataclass(frozen=True)
class BuiltModule:
    path: Path
    vermagic: str  # "6.14.8-2-bpo12-pve SMP preempt mod_unload modversions"
    version: str  # modinfo version: the driver version
    compiler: str  # from .comment: "GCC: (Debian 12.2.0-14+deb12u1) 12.2.0"

    @property
    def kernel(self) -> str:
        return self.vermagic.split(" ", 1)[0]


def kmod_tool(name: str) -> str | None:
    """kmod's ``modinfo``, ``depmod`` or ``modprobe``: Debian installs them in /usr/sbin, which a
    normal user's PATH lacks, yet reading or indexing module files of one's own needs no
    privilege."""
    return shutil.which(
        name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    )


def modinfo() -> str | None:
    return kmod_tool("modinfo")


def inspect_module(ko: Path) -> BuiltModule:
    tool = modinfo()
    if tool is None:
        raise DriverBuildError("modinfo not found (Debian package kmod)")

    def field(name: str) -> str:
        done = subprocess.run(
            [tool, "-F", name, str(ko)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise DriverBuildError(f"modinfo {ko}: {done.stderr.strip()}")
        return done.stdout.strip()

    found = _COMMENT_GCC.search(ko.read_bytes())
    compiler = f"GCC: ({found[1].decode()}) {found[2].decode()}" if found else "unknown"
    return BuiltModule(ko, field("vermagic"), field("version"), compiler)


def build_modules(
    tree: Path, kernel_build: Path, cc: str, jobs: int, out: Path
) -> list[BuiltModule]:
    """Build ``tree`` (a copy of it: the source stays clean) and copy its modules into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuhost-nvidia-build-") as tmp:
        work = Path(tmp) / "src"
        shutil.copytree(tree, work)
        command = build_command(str(work), str(kernel_build), cc, jobs)
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
        built = [work / "kernel-open" / f"{m}.ko" for m in MODULES]
        missing = [p.name for p in built if not p.is_file()]
        if done.returncode != 0 or missing:
            raise DriverBuildError(
                f"{command} failed (exit {done.returncode}, missing {missing}):\n"
                f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        modules = []
        for ko in built:
            dest = out / ko.name
            shutil.copy2(ko, dest)
            modules.append(inspect_module(dest))
        return modules
