"""The real kernel build: Debian's linux-source-6.1 into .debs with gcc-12, through gpuhost's own
code (gpuhost.build.kernel, `gpuhost build`), and a real out-of-tree module built against the
headers package it made.

The one build is tests/build/kernel_cache.py's, cached per machine (minutes the first time).
The compiler is a PATH wrapper that logs every call; the refusals and the second config run
Kconfig only (seconds), into scratch directories and a scratch store.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhost.build.artifacts import Artifact, ArtifactKey, ArtifactStore, slug
from gpuhost.build.driver import MODULES, build_modules, source_version
from gpuhost.build.kernel import (
    KernelBuildError,
    config_hash,
    configure,
    inputs_hash,
    lookup,
    tree_version,
)
from gpuhost.build.kernelbuild import build
from tests.build.kernel_cache import (
    CC,
    FRAGMENT,
    LOCALVERSION,
    BuiltKernel,
    build_record,
    cache_dir,
    compiler_on_path,
    recipe,
    source_tree,
    spec,
)

ROOT = Path(__file__).parents[2]
DRIVER = ROOT / "tests/fixtures/driver-src/open-gpu-kernel-modules"
MAKE_LOGGER = """#!/bin/sh
printf '%s\\n' "$*" >>"{log}"
exec /usr/bin/make "$@"
"""


@pytest.fixture(scope="module")
def tree(built_kernel: BuiltKernel) -> Path:
    return source_tree()


@pytest.fixture(scope="module")
def artifact(built_kernel: BuiltKernel, tree: Path) -> Artifact:
    with compiler_on_path():
        digest = inputs_hash(recipe(tree))
    found = lookup(ArtifactStore(built_kernel.store), digest)
    assert found is not None, f"the build's inputs {digest} are not in {built_kernel.store}"
    return found


def logged(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def make_logger(bindir: Path, log: Path) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / "make").write_text(MAKE_LOGGER.format(log=log))
    (bindir / "make").chmod(0o755)
    return bindir


def package_field(deb: Path, name: str) -> str:
    done = subprocess.run(["dpkg-deb", "-f", str(deb), name], capture_output=True, text=True)
    return done.stdout.strip()


def test_the_release_comes_from_the_tree(built_kernel, tree):
    sublevel = re.search(r"^SUBLEVEL = (\d+)$", (tree / "Makefile").read_text(), re.M)[1]
    assert built_kernel.release == f"6.1.{sublevel}{LOCALVERSION}" == tree_version(tree) + "-1-pve"
    assert re.fullmatch(r"6\.1\.\d+-1-pve", built_kernel.release)
    assert not (tree / ".config").exists()  # built out of tree: the source stays clean


def test_the_packages_are_a_64_bit_kernel_with_modules(built_kernel, artifact):
    release = built_kernel.release
    image = artifact.file(f"linux-image-{release}_1_amd64.deb")
    headers = artifact.file(f"linux-headers-{release}_1_amd64.deb")
    assert sorted(artifact.files) == sorted([image.name, headers.name, "config"])
    for deb, package in ((image, f"linux-image-{release}"), (headers, f"linux-headers-{release}")):
        assert package_field(deb, "Package") == package
        assert package_field(deb, "Architecture") == "amd64"
        assert package_field(deb, "Version") == "1"
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(image)], capture_output=True, text=True, check=True
    ).stdout
    assert f"./boot/vmlinuz-{release}" in listing and f"./boot/config-{release}" in listing
    config = artifact.file("config").read_text().splitlines()
    assert "# Linux/x86_64 6.1." in config[2] and "CONFIG_X86_32=y" not in config
    for line in ("CONFIG_64BIT=y", "CONFIG_X86_64=y"):
        assert line in config
    for name, value in FRAGMENT.items():
        assert f"{name}={value}" in config


def test_the_key_names_release_compiler_and_config(built_kernel, artifact):
    gcc = subprocess.run([CC, "--version"], capture_output=True, text=True, check=True)
    assert built_kernel.compiler == gcc.stdout.splitlines()[0]  # gcc-12 (Debian ...) 12.2.0
    assert built_kernel.compiler.startswith("gcc-12 (")
    key = artifact.key
    assert key == ArtifactKey(
        "kernel",
        built_kernel.release,
        built_kernel.release,
        built_kernel.compiler,
        config_hash(artifact.file("config").read_text()),
    )
    assert (
        artifact.directory
        == built_kernel.store
        / "kernel"
        / key.version
        / key.kernel
        / (slug(key.compiler))
        / key.config
    )
    assert ArtifactStore(built_kernel.store).keys("kernel", key.version, key.kernel) == [key]


def test_the_build_ran_the_compiler_through_the_wrapper(artifact):
    record = build_record(cache_dir(), artifact)
    assert record, "the build left no record (built by an older kernel_cache?)"
    assert record["compiler_calls"] > 100 and record["seconds"] > 0
    print(f"the real build took {record['seconds']} s, {record['compiler_calls']} compiler calls")


def test_a_second_build_and_gpuhost_build_run_no_compiler(built_kernel, tree, artifact, tmp_path):
    cc_log, make_log = tmp_path / "cc.log", tmp_path / "make.log"
    bindir = make_logger(tmp_path / "bin", make_log)
    store = ArtifactStore(built_kernel.store)
    with compiler_on_path(cc_log):  # and the make logger before it
        os.environ["PATH"] = f"{bindir}:{os.environ['PATH']}"
        again = build(recipe(tree), store, tmp_path / "work", jobs=2)
        assert again.cached and again.artifact == artifact
        inventory = tmp_path / "inv.py"
        host = {**spec(tree, built_kernel.store), "driver": {"version": "595.71.05"}}
        inventory.write_text(
            "from gpuhost.spec.inventory import gpu_host\n"
            f"gpu_hosts = [gpu_host('kb', ssh_hostname='192.0.2.1', spec={host!r})]\n"
        )
        done = subprocess.run(
            [str(Path(sys.executable).parent / "gpuhost"), "build", str(inventory)],
            capture_output=True,
            text=True,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"kb: already in the store: {artifact.directory}\n"
    assert logged(cc_log) == [] and logged(make_log) == []


def refused(tmp_path: Path, changed, says: str) -> list[str]:
    """Build ``changed`` into a scratch store: refused with ``says``, before bindeb-pkg."""
    cc_log, make_log = tmp_path / "cc.log", tmp_path / "make.log"
    make_logger(tmp_path / "bin", make_log)
    with compiler_on_path(cc_log):
        os.environ["PATH"] = f"{tmp_path / 'bin'}:{os.environ['PATH']}"  # the make logger first
        with pytest.raises(KernelBuildError, match=re.escape(says)):
            build(changed, ArtifactStore(tmp_path / "store"), tmp_path / "work", jobs=2)
    # gpuhost's own make calls (not Kbuild's sub-makes, which find the logger on PATH too)
    top = [line for line in logged(make_log) if line.startswith(f"-C {changed.tree} O=")]
    assert top and logged(cc_log), "Kconfig ran, with the wrapper"
    assert not list((tmp_path / "work").glob("*.deb"))
    # nothing stored: no artifact, no input-index entry; only the lock the build held
    # (gpuhost.build.kernel.building) is in the store
    left = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert [p.parent.name for p in left] == ["kernel-inputs"] * len(left)
    assert all(p.name.startswith(".") and p.name.endswith(".lock") for p in left), left
    assert not (tmp_path / "work/obj/init/main.o").exists()  # nothing of the kernel compiled
    return [line.split()[-1] for line in top]


def test_another_release_than_the_tree_builds_is_refused(built_kernel, tree, tmp_path):
    other = built_kernel.release.replace("-1-pve", "-2-pve")
    targets = refused(
        tmp_path,
        recipe(tree, release=other),
        f"the tree builds kernel release {built_kernel.release!r} but kernel.version is {other!r}",
    )
    assert targets == ["tinyconfig", "olddefconfig", "kernelrelease"]


def test_an_option_kconfig_drops_is_refused_by_name(tree, tmp_path):
    # VFIO_PCI needs PCI and VFIO, both off in tinyconfig.
    fragment = {**FRAGMENT, "CONFIG_VFIO_PCI": "m"}
    targets = refused(
        tmp_path, recipe(tree, fragment=fragment), "Kconfig dropped CONFIG_VFIO_PCI=m"
    )
    assert targets == ["tinyconfig", "olddefconfig"]


def test_another_config_is_another_key(built_kernel, tree, artifact, tmp_path):
    smp = recipe(tree, fragment={**FRAGMENT, "CONFIG_SMP": "y"})
    with compiler_on_path():
        assert inputs_hash(smp) != inputs_hash(recipe(tree))
        done = configure(smp, tmp_path / "obj")  # Kconfig only: no kernel object compiled
    assert (done.release, done.compiler) == (built_kernel.release, built_kernel.compiler)
    assert "CONFIG_SMP=y" in done.config.splitlines()
    assert done.config_hash != artifact.key.config
    other = dataclasses.replace(artifact.key, config=done.config_hash)
    assert other.path != artifact.key.path and other.path.parent == artifact.key.path.parent


def test_its_headers_package_builds_an_out_of_tree_module(built_kernel, artifact, tmp_path):
    release = built_kernel.release
    root = tmp_path / "root"
    subprocess.run(
        ["dpkg", "-x", str(artifact.file(f"linux-headers-{release}_1_amd64.deb")), str(root)],
        check=True,
    )
    headers = root / f"usr/src/linux-headers-{release}"
    build_link = root / f"lib/modules/{release}/build"
    assert build_link.is_symlink() and str(build_link.readlink()) == str(headers)[len(str(root)) :]
    # `make -C <headers> M=kernel-open modules`, as DKMS or the deploy would run it.
    modules = build_modules(DRIVER, headers, CC, 2, tmp_path / "out")
    gcc = "GCC: " + built_kernel.compiler.split(" ", 1)[1]  # GCC: (Debian 12.2.0-...) 12.2.0
    assert [m.path.stem for m in modules] == list(MODULES)
    for module in modules:
        assert module.vermagic.startswith(f"{release} ") and "mod_unload" in module.vermagic
        assert module.kernel == release
        assert module.version == source_version(DRIVER)
        assert module.compiler == gcc
        elf = module.path.read_bytes()[:20]
        assert elf[:5] == b"\x7fELF\x02" and int.from_bytes(elf[18:20], "little") == 62  # x86-64
