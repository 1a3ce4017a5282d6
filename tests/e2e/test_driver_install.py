"""The NVIDIA modules deploy on twins, for real: the stand-in source tree
(tests/fixtures/driver-src) is built on the twin by its gcc-12 against its kernel's headers (real
Kbuild, real Debian headers stamped with the twin's kernel release), installed, stored; a second
run changes nothing; a reprovisioned twin gets the stored modules with no compiler run on it; and
a twin whose only GCC is a real gcc-11 is refused before anything changes.

Compiler runs are counted on the twin itself: its gcc-12 and make are wrapped by a logger."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import PYINFRA, ROOT, Deploy, inventory, manifest
from twin.pytest_plugin import TwinHandle

TREE = ROOT / "tests/fixtures/driver-src/open-gpu-kernel-modules"
KERNEL = "6.8.12-9-pve"  # the h200x2 profile's kernel: "gcc (Debian 12.2.0-14) 12.2.0"
VERSION = "595.71.05"
INSTALLED = f"lib/modules/{KERNEL}/updates/gpuhost"
LOG = "var/log/gpuhost-test-compiler-runs"
WRAPPED = ("usr/bin/x86_64-linux-gnu-gcc-12", "usr/bin/make")


def spec(store: Path) -> dict:
    return {
        "kernel": {"version": KERNEL},
        "driver": {"version": VERSION, "source": {"tree": str(TREE), "store": str(store)}},
    }


def deploy_modules(inventory_file: Path) -> Deploy:
    run = subprocess.run(
        [str(PYINFRA), "-y", str(inventory_file), "deploys/nvidia_modules.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Deploy(run.returncode, run.stdout + run.stderr)


def count_compiler_runs(twin: TwinHandle) -> Path:
    """Wrap the twin's real gcc-12 and make so each run appends a line to LOG."""
    for rel in WRAPPED:
        real = twin.root / rel
        assert real.is_file() and not real.is_symlink(), real
        real.rename(real.with_name(real.name + ".real"))
        # exec -a keeps argv[0]: gcc names itself after it in --version
        real.write_text(f'#!/bin/bash\necho "{rel} $*" >>/{LOG}\nexec -a "$0" /{rel}.real "$@"\n')
        real.chmod(0o755)
    return twin.root / LOG


def runs(log: Path) -> list[str]:
    """Logged compiler and make runs, less the KernelCompilers fact's `--version` queries (the
    deploy's batched facts ask every compiler its version on each run; that compiles nothing)."""
    lines = log.read_text().splitlines() if log.exists() else []
    queries = [line for line in lines if line.endswith(" --version")]
    assert all(line.startswith(WRAPPED[0]) for line in queries), queries
    return [line for line in lines if line not in queries]


def vermagic(twin: TwinHandle) -> str:
    rc, out, err = twin.run(f"modinfo -k {KERNEL} -F vermagic nvidia")
    assert rc == 0, err
    return out.strip()


def installed(twin: TwinHandle) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((twin.root / INSTALLED).glob("*.ko"))
    }


def stored(store: Path) -> dict[str, str]:
    (manifest_file,) = store.glob(f"nvidia-modules/{VERSION}/{KERNEL}/*/manifest.json")
    import json

    return json.loads(manifest_file.read_text())["files"]


def test_built_on_the_host_then_converged_then_reprovisioned_from_the_store(fresh, tmp_path):
    store = tmp_path / "store"
    first = fresh("h200x2")
    log = count_compiler_runs(first)
    inv = inventory(tmp_path / "first.py", first, spec(store))

    done = deploy_modules(inv)
    assert done.rc == 0, done.output
    assert "building on the host with gcc-12 (Debian 12.2.0" in done.output
    compiled = runs(log)
    assert any(line.startswith("usr/bin/x86_64-linux-gnu-gcc-12 ") for line in compiled)
    assert any(line.startswith("usr/bin/make ") for line in compiled)
    assert vermagic(first).startswith(f"{KERNEL} SMP")
    assert installed(first) == stored(store)
    assert sorted(installed(first)) == [
        "nvidia-drm.ko",
        "nvidia-modeset.ko",
        "nvidia-uvm.ko",
        "nvidia.ko",
    ]
    assert not (first.root / INSTALLED / ".gpuhost-pending").exists()

    again = deploy_modules(inv)
    assert again.rc == 0, again.output
    assert not again.changed, again.output
    assert "(from the store)" in again.output  # the stored build, found unchanged on the host
    assert runs(log) == compiled  # nothing compiled on the converged run

    # Reprovisioned: a fresh host of the same kind gets the stored build; nothing compiles.
    second = fresh("h200x2")
    log2 = count_compiler_runs(second)
    done2 = deploy_modules(inventory(tmp_path / "second.py", second, spec(store)))
    assert done2.rc == 0, done2.output
    assert done2.changed and "(from the store)" in done2.output
    assert runs(log2) == []
    assert installed(second) == stored(store)
    assert vermagic(second).startswith(f"{KERNEL} SMP")


def _give_real_gcc11_only(twin: TwinHandle) -> str:
    """The machine's own gcc-11 package files go into the twin; its gcc-12 names are hidden."""
    gcc11 = shutil.which("gcc-11")
    if gcc11 is None:
        pytest.skip("needs gcc-11 on this machine: apt-get install -y gcc-11")
    files = subprocess.run(
        ["dpkg", "-L", "gcc-11"], capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        src = Path(name)
        if src.is_file() or src.is_symlink():
            dest = twin.root / name.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest, follow_symlinks=False)
    for name in ("gcc-12", "gcc", "cc", "x86_64-linux-gnu-gcc-12"):
        path = twin.root / "usr/bin" / name
        if path.exists() or path.is_symlink():
            path.rename(twin.root / "usr/lib" / f"hidden-{name}")
    rc, out, err = twin.run("gcc-11 --version | head -n 1; command -v gcc-12 gcc cc || true")
    assert rc == 0 and out.startswith("gcc-11 (Debian 11."), out + err
    return out.splitlines()[0]


def test_a_host_with_only_gcc_11_is_refused_before_anything_changes(fresh, tmp_path):
    store = tmp_path / "store"
    twin = fresh("h200x2")
    gcc11 = _give_real_gcc11_only(twin)
    before = manifest(twin.root)

    done = deploy_modules(inventory(tmp_path / "inv.py", twin, spec(store)))
    assert done.rc != 0, done.output
    assert "gcc (Debian 12.2.0-14) 12.2.0" in done.output  # the kernel's compiler
    assert gcc11 in done.output  # the host's
    assert "Install gcc-12 12.2.0" in done.output
    assert manifest(twin.root) == before
    assert not (twin.root / INSTALLED).exists()
    assert not (twin.root / "var/lib/gpuhost/driver-build").exists()
    assert not store.exists() or not any(store.rglob("manifest.json"))
