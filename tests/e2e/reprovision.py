"""The bricked-host story on twins, shared by tests/e2e/test_reprovision.py and
benchmarks/reprovision.py: a freshly installed kpro6 (PVE's 6.8.12-9-pve only, on a btrfs root)
gets the real kernel from the artifact store (`make bindeb-pkg` .debs,
tests/build/kernel_cache.py; installed with dpkg), the NVIDIA open modules built on it for that kernel with the kernel's own gcc-12
(real Kbuild against the kernel's own headers package) and the userspace and GSP firmware from
the stand-in NVIDIA installer; the kernel is trial-booted, gated and pinned. The same spec and
stores on a wiped twin then restore it without one compiler run on the target."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.build.kernel_cache import BuiltKernel, source_tree, spec
from tests.e2e.conftest import ROOT, Deploy, deploy, inventory
from tests.e2e.test_driver_install import TREE, count_compiler_runs, runs
from twin.nvinstaller import build_installer
from twin.pytest_plugin import TwinHandle

VERSION = "595.71.05"
OLD = "6.8.12-9-pve"
GCC = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"


def fresh_kpro6(tmp: Path, boot: dict | None = None) -> str:
    """The kpro6 profile as the PVE 8 installer leaves it: one kernel (6.8.12-9-pve); ``boot``
    changes its boot path (e.g. GRUB on the ESPs)."""
    data = yaml.safe_load((ROOT / "gpuhost-twin/twin/profiles/kpro6.yaml").read_text())
    data["kernels"] = [{"version": OLD, "gcc": GCC}]
    data["boot"].update(boot or {})
    if data["boot"]["loader"] == "grub":
        data["boot"].pop("kernel_cmdline", None)
    path = tmp / "kpro6-fresh.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# The test kernel is a `make bindeb-pkg` build of a plain tree: no zfs.ko, so a host whose root
# is on ZFS refuses it (gpuhost/build/features.py). The reprovisioned kpro6 is the Proxmox
# installer's other UEFI layout with systemd-boot, a btrfs root, which needs no zfs.ko (the twin
# does not model file system drivers).
PLAIN_KERNEL_ROOT = {"root_fs": "btrfs", "kernel_cmdline": "root=/dev/sda3 ro quiet"}


def host_spec(kernel: BuiltKernel, driver_store: Path, installer: Path) -> dict:
    base = spec(source_tree(), kernel.store)
    base["kernel"]["keep"] = [OLD]
    base["driver"] = {
        "version": VERSION,
        "source": {"tree": str(TREE), "store": str(driver_store), "installer": str(installer)},
    }
    return base


@dataclass
class Provisioned:
    twin: TwinHandle
    inventory: Path
    run: Deploy
    seconds: float
    compiler_runs: list[str]  # gcc-12 and make runs on the twin (version queries left out)


def provision(
    start, kernel: BuiltKernel, tmp: Path, name: str, artifacts: dict | None = None, builders=""
) -> Provisioned:
    """Start a fresh kpro6 twin (``start(profile)``), deploy the spec once, time it.
    ``artifacts``/``builders``: the spec's artifacts and the build hosts that declares."""
    twin = start(fresh_kpro6(tmp, PLAIN_KERNEL_ROOT))
    log = count_compiler_runs(twin)
    installer = tmp / "nvidia" / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    if not installer.exists():
        build_installer(VERSION, installer.parent)
    spec = host_spec(kernel, tmp / "driver-store", installer)
    spec["artifacts"] = artifacts or spec["artifacts"]
    inv = inventory(tmp / f"{name}.py", twin, spec, builders)
    started = time.monotonic()
    result = deploy(inv)
    return Provisioned(twin, inv, result, time.monotonic() - started, runs(log))
