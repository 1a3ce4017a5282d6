"""A pve-kernel tree built the Proxmox way through gpuhost (gpuhost.build.pvekernel): the CI
stand-in (tests/build/pvekernel_standin.py) goes through its own packaging on a tiny config
into proxmox-kernel-KVNAME and proxmox-headers-KVNAME, with zfs.ko, spl.ko and the
pcie_acs_override parameter, the spec's fragment and compiler.

Built once per machine into $GPUHOST_TEST_CACHE/pve-store (minutes cold, on the source tree
tests/build/kernel_cache.py unpacks); what the cold build took and which compiler calls it made
are kept beside it, so a later session checks them without building again.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from gpuhost.build.artifacts import Artifact, ArtifactStore
from gpuhost.build.features import feature_problems, package_features
from gpuhost.build.kernel import KernelRecipe, local_jobs
from gpuhost.build.kernelbuild import build
from gpuhost.build.kernelstore import plan_install
from tests.build.kernel_cache import (
    CC,
    GCC,
    _drop_others,
    _locked,
    cache_dir,
    compiler_on_path,
    missing,
    source_tree,
)
from tests.build.pvekernel_standin import release, write_standin

# The spec's fragment: options the stand-in's packaging leaves to the user (not in its
# CONFIG_OPTS), so finding them in the built config shows the fragment went through.
FRAGMENT = {"CONFIG_MODULE_UNLOAD": "y", "CONFIG_PRINTK": "y"}


class PveBuild(NamedTuple):
    tree: Path
    store: Path
    release: str
    artifact: Artifact
    record: dict  # the cold build's seconds, compiler calls, the zfs/spl compiles it logged


def spec(tree: Path, store: Path) -> dict:
    return {
        "kernel": {
            "version": release(tree / "submodules/ubuntu-kernel"),
            "source": "build",
            "build": {"repo": str(tree), "config": dict(FRAGMENT)},
        },
        "toolchain": {"gcc": GCC},
        "driver": {"version": "595.71.05"},
        "artifacts": {"store": str(store)},
    }


def recipe(tree: Path) -> KernelRecipe:
    """What `gpuhost build` makes of spec(): base_config left at its default (the tree's)."""
    kvname = release(tree / "submodules/ubuntu-kernel")
    return KernelRecipe(
        tree=tree,
        base_config="defconfig",
        release=kvname,
        localversion=kvname.removeprefix(kvname.split("-")[0]),
        cc=CC,
        fragment=dict(FRAGMENT),
    )


@pytest.fixture(scope="module")
def pve() -> PveBuild:
    lacking = missing()
    if lacking:
        pytest.skip(f"the real kernel build needs {', '.join(lacking)}")
    cache = cache_dir()
    kernel = source_tree(cache)
    tree = write_standin(cache / "pve-standin" / kernel.parent.name, kernel)
    store = ArtifactStore(cache / "pve-store")
    with _locked(cache):
        work = Path(tempfile.mkdtemp(prefix="pve-work-", dir=cache))
        log = work.with_name(f"{work.name}.cc-log")
        try:
            with compiler_on_path(log, cache):
                started = time.monotonic()
                result = build(recipe(tree), store, work / "out", local_jobs())
                seconds = round(time.monotonic() - started, 1)
            record_path = cache / "builds" / f"{result.artifact.meta['inputs']}.json"
            if not result.cached:
                calls = log.read_text().splitlines() if log.is_file() else []
                record = {
                    "seconds": seconds,
                    "compiler_calls": len(calls),
                    "zfs_objects": sorted(zfs_objects(calls)),
                    "jobs": local_jobs(),
                }
                record_path.parent.mkdir(exist_ok=True)
                record_path.write_text(json.dumps(record) + "\n")
            _drop_others(store, result.artifact.key)  # an older stand-in's build of the release
        finally:
            subprocess.run(["rm", "-rf", str(work)], check=False)
            log.unlink(missing_ok=True)
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    return PveBuild(tree, store.root, result.artifact.key.version, result.artifact, record)


def zfs_objects(calls: list[str]) -> set[str]:
    """The objects the logged compiler calls wrote in the zfs module directory (not Kbuild's
    cc-option probes, which write under .tmp_*)."""
    found = set()
    for call in calls:
        out = re.search(r" -o (\S+)", call)
        if out and "/pkg-zfs/module/" in out[1] and "/.tmp_" not in out[1]:
            found.add(out[1].rsplit("/", 1)[-1])
    return found


def field(deb: Path, name: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True, check=True
    ).stdout.strip()


def unpacked(deb: Path, dest: Path) -> Path:
    subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
    return dest


def test_the_packages_are_proxmox_kernel_and_headers_of_the_trees_release(pve):
    assert re.fullmatch(r"6\.1\.\d+-2-pve", pve.release)  # KVNAME: KERNEL_VER-KREL-pve
    image = f"proxmox-kernel-{pve.release}"
    headers = f"proxmox-headers-{pve.release}"
    debs = sorted(n for n in pve.artifact.files if n.endswith(".deb"))
    assert [n.split("_")[0] for n in debs] == [headers, image]  # nothing else is kept
    for name in debs:
        deb = pve.artifact.file(name)
        assert field(deb, "Package") in (image, headers)
        assert field(deb, "Architecture") == "amd64"
    deb = next(pve.artifact.file(n) for n in debs if n.startswith(image))
    postinst = subprocess.run(
        ["dpkg-deb", "-I", str(deb), "postinst"], capture_output=True, text=True, check=True
    ).stdout
    assert f"depmod {pve.release}\n" in postinst and "/etc/kernel/postinst.d" in postinst
    install = plan_install(pve.release, "build", GCC, ArtifactStore(pve.store))
    assert Path(install.debs[0]).name.startswith(f"{image}_")  # the image installs first


def test_zfs_and_spl_are_modules_of_that_kernel(pve, tmp_path):
    deb = next(pve.artifact.file(n) for n in pve.artifact.files if n.startswith("proxmox-kernel-"))
    root = unpacked(deb, tmp_path / "root")
    mods = root / f"usr/lib/modules/{pve.release}"
    for name in ("zfs", "spl"):
        info = subprocess.run(
            ["/sbin/modinfo", "-F", "vermagic", str(mods / f"zfs/{name}.ko")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert info.startswith(f"{pve.release} "), info
    deps = (mods / "modules.dep").read_text()
    assert "zfs/zfs.ko: zfs/spl.ko" in deps  # depmod ran: zfs loads after spl
    system_map = (root / f"boot/System.map-{pve.release}").read_text()
    assert " pcie_acs_override_setup\n" in system_map
    assert (root / f"boot/vmlinuz-{pve.release}").stat().st_size > 100_000
    features = package_features(deb, pve.release)
    assert (features.zfs, features.acs_override) == (True, True)
    assert feature_problems(pve.release, features, "root", "downstream", "the build") == []


def test_the_fragment_and_the_compiler_are_in_the_built_config(pve):
    config = pve.artifact.file("config").read_text().splitlines()
    for name, value in FRAGMENT.items():
        assert f"{name}={value}" in config
    assert "CONFIG_64BIT=y" in config and "CONFIG_MODULES=y" in config  # the packaging's own
    gcc = subprocess.run([CC, "--version"], capture_output=True, text=True, check=True)
    assert f'CONFIG_CC_VERSION_TEXT="{gcc.stdout.splitlines()[0]}"' in config
    assert pve.artifact.key.compiler == gcc.stdout.splitlines()[0]


def test_every_compile_went_through_the_specs_compiler(pve):
    """The wrapper on PATH named gcc-12 logged the kernel's compiles and zfs's and spl's: CC=
    reached past dpkg-buildpackage and debian/rules into every make."""
    assert pve.record, "the cold build left no record"
    assert pve.record["compiler_calls"] > 300
    assert {"spl.o", "zfs.o"} <= set(pve.record["zfs_objects"]), pve.record["zfs_objects"]
    print(f"the stand-in's cold build took {pve.record['seconds']} s")


def test_a_second_gpuhost_build_runs_no_compiler(pve, tmp_path):
    cc_log = tmp_path / "cc.log"
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        "from gpuhost.spec.inventory import gpu_host\n"
        f"gpu_hosts = [gpu_host('pve', ssh_hostname='192.0.2.1', spec={spec(pve.tree, pve.store)!r})]\n"
    )
    with compiler_on_path(cc_log):
        started = time.monotonic()
        done = subprocess.run(
            [str(Path(sys.executable).parent / "gpuhost"), "build", str(inventory)],
            capture_output=True,
            text=True,
        )
        seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"pve: already in the store: {pve.artifact.directory}\n"
    assert done.stderr == ""  # no plain-tree note: this is a Proxmox-packaged kernel
    assert not cc_log.exists()
    print(f"the cached build took {seconds:.1f} s")
