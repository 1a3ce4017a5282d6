"""End-to-end on twins: the real pyinfra CLI deploys to simulated hosts over real SSH."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from twin.hwtesting import ModuleCache, missing_build_tools
from twin.pytest_plugin import TwinHandle

ROOT = Path(__file__).parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
# Files a deploy may touch; /proc, /sys, /dev and /run are the twin's live state, not files.
WATCHED = ("etc", "boot", "var/lib", "root", "usr/local", "lib/modules", "lib/firmware")


@dataclass
class Deploy:
    rc: int
    output: str

    @property
    def reboots(self) -> int:
        """Confirmed reboots: plain ones and trial boots that passed their gate."""
        return self.output.count("kernel command line confirmed") + self.output.count(
            "passed its trial boot"
        )

    @property
    def changed(self) -> bool:
        """pyinfra's results table: any operation with a count in its Success (changed) column."""
        table = self.output.split("--> Results:", 1)[1]
        rows = [line.split() for line in table.splitlines() if " | " in line]
        assert rows, self.output
        return any(row[-3] != "-" for row in rows)  # columns: Hosts Success Error No-Change


def inventory(path: Path, twin: TwinHandle, spec: dict, builders: str = "") -> Path:
    """A one-host inventory file for a twin, like a user's, with host keys verified;
    ``builders``: the build hosts' declarations, e.g. ``builder = build_host('builder', ...)``."""
    path.write_text(
        "from gpuhost.spec.inventory import build_host, gpu_host\n"
        f"hosts = [gpu_host({twin.name!r}, {spec!r}, ssh_hostname={twin.address!r}, "
        f"ssh_user='root', ssh_key={str(twin.key)!r}, ssh_known_hosts_file={str(twin.known_hosts)!r}, "
        "ssh_strict_host_key_checking='yes', gpuhost_reboot_delay=1)]\n"
        + (f"{builders}\n" if builders else "")
    )
    return path


def deploy(inventory_file: Path, *args: str, env: dict[str, str] | None = None) -> Deploy:
    run = subprocess.run(
        # --dry without -y: pyinfra then runs change detection and lists what would change
        [str(PYINFRA), *(args or ["-y"]), str(inventory_file), "deploys/gpu_host.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    return Deploy(run.returncode, run.stdout + run.stderr)


def manifest(root: Path) -> dict[str, str]:
    """sha256 of every file a deploy could change, read from outside the twin."""
    found = {}
    for top in WATCHED:
        for path in sorted((root / top).rglob("*")):
            if path.is_symlink():
                found[str(path.relative_to(root))] = "-> " + str(path.readlink())
            elif path.is_file():
                found[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="session")
def modules() -> ModuleCache:
    """The machine's stand-in module cache (/var/cache/gpuhost-twin/kmods, keyed by the headers
    and the module source): each .ko is built once per machine, not once per test run."""
    problem = missing_build_tools()
    if problem:
        pytest.skip(problem)
    return ModuleCache()


def with_driver(twin: TwinHandle, modules: ModuleCache, version: str) -> str:
    """Give a twin an installed NVIDIA driver (real .ko files for its kernel) and boot it.

    This stands for a host whose driver was installed earlier; the driver deploy will do it.
    """
    kver = twin.run("uname -r")[1].strip()
    modules.install(twin.root, kver, version=version)
    twin.reboot()
    return kver


@pytest.fixture
def fresh(twin_fleet) -> Iterator:
    """A factory of fresh twins of a profile, stopped after the test."""
    started: list[TwinHandle] = []

    def start(profile: str) -> TwinHandle:
        (handle,) = twin_fleet.start(1, profile)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        twin_fleet.stop(handle)
