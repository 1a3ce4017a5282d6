"""Helpers for tests of the simulated hardware: temp roots, real modules, running shims, captures.

Everything works on a plain temp dir (no chroot, no SSH): shims run with TWIN_ROOT=<root>.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from twin import boot, hardware, modbuild
from twin.profile import Profile, load_profile

CAPTURES = Path(__file__).resolve().parent.parent / "tests/fixtures/captures"
DRIVER = "580.159.04"  # the captured driver


def missing_build_tools(compilers: tuple[str, ...] = ("gcc-12",)) -> str | None:
    """Why real module builds cannot run here (None when they can); see twin/APT_PACKAGES_HW."""
    if modbuild.debian_headers(Path("/")) is None:
        return "no Debian linux-headers-*-amd64 in /usr/src (apt-get install linux-headers-amd64)"
    for tool in ("make", "kmod", *compilers):
        if shutil.which(tool) is None:
            return f"{tool} not installed (see twin/APT_PACKAGES_HW)"
    return None


class ModuleCache:
    """Real .ko files built once per (kernel, compiler, version, license, name) into a directory.

    Without a workdir they go to $GPUHOST_TWIN_CACHE/kmods (default /var/cache/gpuhost-twin),
    keyed by the Debian headers and the module source, so a machine builds each one once.
    """

    def __init__(self, workdir: Path | None = None) -> None:
        if workdir is None:
            headers = modbuild.debian_headers(Path("/"))
            recipe = hashlib.sha256(
                f"{headers}{modbuild.MODULE_C}{modbuild.GCC11_OVERRIDES}".encode()
            ).hexdigest()[:12]
            base = Path(os.environ.get("GPUHOST_TWIN_CACHE", "/var/cache/gpuhost-twin"))
            workdir = base / "kmods" / recipe
        self.workdir = workdir
        self.headers: dict[str, Path] = {}

    def ko(
        self,
        name: str,
        kver: str,
        version: str = DRIVER,
        cc: str = "gcc-12",
        license: str = "Dual MIT/GPL",
    ) -> Path:
        key = f"{kver}/{cc}/{version}/{license.replace(' ', '_').replace('/', '_')}"
        done = self.workdir / "ko" / key / f"{name}.ko"
        if done.exists():
            return done
        if kver not in self.headers:
            self.headers[kver] = modbuild.stamp_headers(
                Path("/"), kver, self.workdir / "hdr" / kver
            )
        built = modbuild.build_module(
            self.headers[kver], name, version, self.workdir / "build" / key, cc=cc, license=license
        )
        done.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, done.with_suffix(".tmp"))
        os.replace(done.with_suffix(".tmp"), done)  # concurrent runs never see half a file
        shutil.rmtree(self.workdir / "build" / key, ignore_errors=True)
        return done

    def install(
        self,
        root: Path,
        kver: str,
        names: tuple[str, ...] = ("nvidia", "nvidia_uvm"),
        firmware: bool = True,
        **kw: str,
    ) -> None:
        version = kw.get("version", DRIVER)
        kos = {n: self.ko(n, kver, **kw) for n in names}
        modbuild.install_driver(root, kver, version, kos, firmware=firmware)


def make_root(path: Path, profile: str | Profile) -> Path:
    """A fresh twin root for profile (installed, not booted)."""
    prof = load_profile(profile) if isinstance(profile, str) else profile
    path.mkdir(parents=True, exist_ok=True)
    hardware.install(path, prof)
    return path


def boot_root(root: Path, profile: str | Profile) -> None:
    boot.simulate_boot(root, load_profile(profile) if isinstance(profile, str) else profile)


def run(root: Path, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run an installed shim the way the twin would, with TWIN_ROOT=root."""
    return subprocess.run(
        [sys.executable, str(root / "usr/local/bin" / tool), *args],
        env=dict(os.environ, TWIN_ROOT=str(root), LC_ALL="C"),
        capture_output=True,
        text=True,
        check=False,
    )


def run_capture_cmd(root: Path, cmd: str) -> subprocess.CompletedProcess[str]:
    """Run a capture's exact shell command against root: /proc, /sys, /dev and tools re-rooted."""
    script = re.sub(r"(?<![\w/])/(proc|sys|dev|lib)/", rf"{root}/\1/", cmd)
    for tool in hardware.TOOLS:
        script = re.sub(
            rf"(?<![\w/.-]){re.escape(tool)}(?![\w-])",
            f"{sys.executable} {root}/usr/local/bin/{tool}",
            script,
        )
    proc = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, TWIN_ROOT=str(root), LC_ALL="C", LANG="C"),
    )
    proc.stdout = proc.stdout.replace(str(root), "")
    return proc


def capture(host: str, name: str) -> tuple[str, str, int]:
    """(command, stdout, exit status) of a real capture."""
    d = CAPTURES / host
    return (
        (d / f"{name}.cmd").read_text().strip(),
        (d / f"{name}.out").read_text(),
        int((d / f"{name}.rc").read_text()),
    )
