"""Helpers for tests of the simulated hardware: temp roots, real modules, running shims, captures.

Everything works on a plain temp dir (no chroot, no SSH): shims run with TWIN_ROOT=<root>.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from twin import boot, hardware, hwsim, modbuild
from twin.modbuild import ModuleCache  # noqa: F401  (tests build modules through it)
from twin.profile import Profile, load_profile

CAPTURES = Path(__file__).resolve().parents[2] / "tests/fixtures/captures"  # gpuhost checkout
DRIVER = modbuild.CAPTURED_DRIVER


def missing_build_tools(compilers: tuple[str, ...] = ("gcc-12",)) -> str | None:
    """Why real module builds cannot run here (None when they can); see twin/APT_PACKAGES_HW."""
    if modbuild.debian_headers(Path("/")) is None:
        return "no Debian linux-headers-*-amd64 in /usr/src (apt-get install linux-headers-amd64)"
    for tool in ("make", "kmod", *compilers):
        if shutil.which(tool) is None:
            return f"{tool} not installed (see twin/APT_PACKAGES_HW)"
    return None


def needs_root() -> str | None:
    """Why a test that makes device nodes (mknod) or writes root-only sysfs cannot run here."""
    if os.geteuid() != 0:
        return "makes character device nodes and writes root-only sysfs files: run as root"
    return None


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


# --- reading and changing a test root ---------------------------------------------------------


def state(root: Path) -> dict:
    return json.loads((root / hwsim.STATE).read_text())


def read(root: Path, rel: str) -> str:
    return (root / rel).read_text()


def refresh(root: Path, **changes: object) -> None:
    """What the Proxmox helper's proxmox-boot-tool refresh / update-grub records (boot.BOOTCFG)."""
    path = root / boot.BOOTCFG
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


# -- command line ---------------------------------------------------------------------------------
