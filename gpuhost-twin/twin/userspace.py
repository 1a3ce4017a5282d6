"""The NVIDIA driver's userspace for twins: real shared libraries, built per driver version.

Stands in for what `NVIDIA-Linux-x86_64-<ver>.run` (with or without --no-kernel-modules) puts in
/usr/lib/x86_64-linux-gnu: libcuda.so.<ver> (soname libcuda.so.1) with its .so.1 and .so links,
and libnvidia-ml.so.<ver> (.so.1), whose name the twin's nvidia-smi compares with the kernel
driver's version. The libcuda is twin/libcuda/libcuda.c (see there for what it checks), compiled
with the machine's gcc and cached per (source, version) like modbuild.ModuleCache does .ko files.

    install_root(root, "580.159.04")                        # a twin root or a guest rootfs
    UserspaceCache().build("570.124.06")                    # {"libcuda": Path, "libnvidia-ml": Path}
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from twin.hwshim.smi_text import CUDA_BY_BRANCH

SOURCES = Path(__file__).parent / "libcuda"
LIBDIR = "usr/lib/x86_64-linux-gnu"
LIBS = ("libcuda", "libnvidia-ml")
# C11 + POSIX, no _GNU_SOURCE: a newer machine's glibc gives no symbol a bookworm guest lacks.
CFLAGS = ["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O2", "-Wall", "-Wextra", "-Werror"]
LDFLAGS = ["-fPIC", "-shared", "-fvisibility=hidden", "-pthread"]


class UserspaceBuildError(RuntimeError):
    """gcc failed; the message carries its output."""


def driver_api(version: str) -> int:
    """cuDriverGetVersion of a driver branch: its CUDA version as 1000*major + 10*minor
    (580 -> 13000, as the real H200 capture shows; 570 -> 12080; 595 -> 13020). A branch the
    table lacks gets the newest CUDA of an older branch, as a driver never reports a newer one."""
    branch = int(version.split(".")[0])
    known = [b for b in CUDA_BY_BRANCH if b <= branch]
    if not known:
        raise ValueError(f"driver {version}: no CUDA version known for branch {branch} or older")
    major, minor = CUDA_BY_BRANCH[max(known)].split(".")
    return int(major) * 1000 + int(minor) * 10


class UserspaceCache:
    """Libraries built once per (sources, flags, version) under $GPUHOST_TWIN_CACHE/userspace."""

    def __init__(self, workdir: Path | None = None) -> None:
        if workdir is None:
            text = "".join(p.read_text() for p in sorted(SOURCES.glob("*.c")))
            recipe = hashlib.sha256(f"{text}{CFLAGS}{LDFLAGS}".encode()).hexdigest()[:12]
            base = Path(os.environ.get("GPUHOST_TWIN_CACHE", "/var/cache/gpuhost-twin"))
            workdir = base / "userspace" / recipe
        self.workdir = workdir

    def build(self, version: str) -> dict[str, Path]:
        return {lib: self._lib(lib, version) for lib in LIBS}

    def _lib(self, lib: str, version: str) -> Path:
        done = self.workdir / version / f"{lib}.so.{version}"
        if done.exists():
            return done
        done.parent.mkdir(parents=True, exist_ok=True)
        tmp = done.with_name(f".{done.name}.{os.getpid()}.tmp")
        cmd = [
            "gcc",
            *CFLAGS,
            *LDFLAGS,
            f"-Wl,-soname,{lib}.so.1",
            f'-DTWIN_VERSION="{version}"',
            f"-DTWIN_DRIVER_API={driver_api(version)}",
            "-o",
            str(tmp),
            str(SOURCES / f"{lib}.c"),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise UserspaceBuildError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
        os.replace(tmp, done)  # concurrent builds never see half a library
        return done


def install_root(root: Path, version: str, cache: UserspaceCache | None = None) -> None:
    """Install the userspace of ``version`` into the tree at root, replacing any other version
    (the .run installer uninstalls the previous driver first), then refresh ld.so.cache."""
    built = (cache or UserspaceCache()).build(version)
    libdir = Path(root) / LIBDIR
    libdir.mkdir(parents=True, exist_ok=True)
    for lib, path in built.items():
        for old in libdir.glob(f"{lib}.so*"):
            old.unlink()
        shutil.copy2(path, libdir / path.name)
        (libdir / f"{lib}.so.1").symlink_to(path.name)
        (libdir / f"{lib}.so").symlink_to(f"{lib}.so.1")
    if shutil.which("ldconfig"):  # as the installer does; dlopen finds the multiarch dir anyway
        subprocess.run(["ldconfig", "-r", str(root)], capture_output=True, check=False)


def installed_version(root: Path) -> str | None:
    """The version of the libcuda installed at root, from its file name; None if none."""
    found = sorted((Path(root) / LIBDIR).glob("libcuda.so.*.*"))
    return found[0].name.removeprefix("libcuda.so.") if found else None
