"""The kernel build's pure parts (config lines, hashes, the jobs rule), its spec fields and the
`gpuhost build` refusals. The real build is tests/build/test_kernel_build.py."""

from __future__ import annotations

import dataclasses
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from gpuhost.build.artifacts import ArtifactKey, ArtifactStore
from gpuhost.build.command import build_for, recipe_for
from gpuhost.build.kernel import (
    GIB,
    BuildResult,
    KernelBuildError,
    KernelRecipe,
    _jobs,
    _remember,
    building,
    clone,
    compiler_text,
    config_hash,
    fragment_lines,
    inputs_hash,
    machine_arch,
    make_argv,
    mem_available,
    source_tree,
    tree_version,
)
from gpuhost.build.kernelbuild import build
from gpuhost.cli import main
from gpuhost.spec.host import HostSpec
from gpuhost.spec.validate import SpecError, validate_spec

BUILD = {
    "version": "6.14.8-2-bpo12-pve",
    "source": "build",
    "build": {"repo": "/srv/linux-6.14", "config": {"CONFIG_VFIO_PCI": "m"}},
}
BASE = {"kernel": BUILD, "driver": {"version": "595.71.05"}}


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        validate_spec("inventory/x.py", "kb", data)
    return info.value.problems


def test_fragment_lines_quote_text_and_spell_n_as_kconfig_does():
    assert fragment_lines(
        {"CONFIG_B": "n", "CONFIG_A": "y", "CONFIG_N": "0x10", "CONFIG_T": "-x pve"}
    ) == ["CONFIG_A=y", "# CONFIG_B is not set", "CONFIG_N=0x10", 'CONFIG_T="-x pve"']


def test_config_hash_ignores_comments_but_not_settings():
    config = "#\n# Linux/x86 6.1.192 Kernel Configuration\n#\nCONFIG_A=y\n# CONFIG_B is not set\n"
    other_header = config.replace("6.1.192", "6.1.193")
    assert config_hash(config) == config_hash(other_header)
    assert config_hash(config) != config_hash(config.replace("# CONFIG_B is not set\n", ""))
    assert config_hash(config) != config_hash(config.replace("CONFIG_A=y", "CONFIG_A=m"))


def test_compiler_text_comes_from_the_config():
    config = (
        'CONFIG_CC_VERSION_TEXT="gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"\nCONFIG_CC_IS_GCC=y\n'
    )
    assert compiler_text(config) == "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"
    with pytest.raises(KernelBuildError, match="no CONFIG_CC_VERSION_TEXT"):
        compiler_text("CONFIG_CC_IS_GCC=y\n")


@pytest.mark.parametrize(
    ("cores", "mem_gib", "jobs"),
    [
        (2, 24, 2),  # CI: cores bound it
        (64, 32, 20),  # a big box with little memory: (32 - 2) / 1.5
        (16, 2, 1),  # never below one
        (8, 3.4, 0 + 1),
    ],
)
def test_jobs_from_cores_and_memory(cores, mem_gib, jobs):
    assert _jobs(cores, int(mem_gib * GIB)) == jobs


def test_mem_available_from_proc_meminfo():
    text = "MemTotal:       24567012 kB\nMemFree:  100 kB\nMemAvailable:   23900000 kB\n"
    assert mem_available(text) == 23900000 * 1024
    with pytest.raises(KernelBuildError, match="MemAvailable"):
        mem_available("MemTotal: 1 kB\n")


def test_tree_version_reads_the_makefile(tmp_path):
    (tmp_path / "Makefile").write_text(
        "# SPDX\nVERSION = 6\nPATCHLEVEL = 14\nSUBLEVEL = 8\nEXTRAVERSION =\nNAME = Baby Opossum\n"
    )
    assert tree_version(tmp_path) == "6.14.8"
    with pytest.raises(KernelBuildError, match="must be a kernel source tree"):
        tree_version(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("machine", "arch"),
    [("x86_64", "x86_64"), ("aarch64", "arm64"), ("riscv64", "")],
)
def test_arch_is_the_machines_own(machine, arch):
    # Unset, ARCH is the kernel's SUBARCH "x86", whose tinyconfig is a 32-bit i386 kernel.
    assert machine_arch(machine) == arch


def test_every_make_call_names_arch_and_compiler(tmp_path):
    recipe = KernelRecipe(
        tree=tmp_path,
        base_config="tinyconfig",
        release="6.1.1-1-pve",
        localversion="-1-pve",
        arch="x86_64",
    )
    argv = make_argv(recipe, tmp_path / "obj", "-s", "kernelrelease")
    assert argv[:5] == ["make", "-C", str(tmp_path), f"O={tmp_path}/obj", "ARCH=x86_64"]
    assert {"CC=gcc-12", "HOSTCC=gcc-12", "LOCALVERSION=-1-pve"} <= set(argv)
    assert argv[-2:] == ["-s", "kernelrelease"]
    native = KernelRecipe(
        tree=tmp_path,
        base_config="tinyconfig",
        release="6.1.1-1-pve",
        localversion="-1-pve",
        arch="",
    )
    assert not [a for a in make_argv(native, tmp_path / "obj") if a.startswith("ARCH=")]


def test_the_default_arch_is_this_machines_and_part_of_the_inputs(tmp_path):
    if shutil.which("gcc-12") is None:
        pytest.skip("needs gcc-12 (./gpuhost-setup installs it)")
    (tmp_path / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 1\nSUBLEVEL = 1\n")
    recipe = KernelRecipe(
        tree=tmp_path, base_config="tinyconfig", release="6.1.1-1-pve", localversion="-1-pve"
    )
    assert recipe.arch == machine_arch(platform.machine())
    if platform.machine() == "x86_64":
        assert recipe.arch == "x86_64"
    assert inputs_hash(recipe) == inputs_hash(dataclasses.replace(recipe))
    assert inputs_hash(recipe) != inputs_hash(dataclasses.replace(recipe, arch="i386"))


def test_spec_fields_and_defaults():
    spec = HostSpec.model_validate(BASE)
    assert spec.artifacts.store == "/var/cache/gpuhost/artifacts"
    assert spec.artifacts.build_host is None
    recipe = spec.kernel.build
    assert recipe.base_config == "defconfig" and recipe.localversion is None
    assert recipe.localversion_for(spec.kernel.version) == "-2-bpo12-pve"
    built = recipe_for("kb", spec, Path("/srv/linux-6.14"))
    assert (built.cc, built.localversion, built.release) == (
        "gcc-12",
        "-2-bpo12-pve",
        "6.14.8-2-bpo12-pve",
    )
    assert built.fragment == {"CONFIG_VFIO_PCI": "m"}


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("base_config", "config", "is not a base config"),
        ("base_config", "/etc/../x.config", "'.' or '..' component"),
        ("localversion", "-2 ;rm", "is not a kernel LOCALVERSION"),
        ("localversion", "2-pve", "is not a kernel LOCALVERSION"),
    ],
)
def test_build_fields_are_grammars(field, value, says):
    data = {**BASE, "kernel": {**BUILD, "build": {**BUILD["build"], field: value}}}
    (problem,) = problems(data)
    assert f"kernel.build.{field}" in problem and says in problem


@pytest.mark.parametrize(
    ("store", "says"),
    [("relative/store", "not absolute"), ("/var/cache/x/", "ends with '/'"), (7, "string")],
)
def test_the_store_is_an_absolute_path(store, says):
    (problem,) = problems({**BASE, "artifacts": {"store": store}})
    assert "artifacts.store" in problem and says in problem


def test_gpuhost_build_refusals(tmp_path):
    package = HostSpec.model_validate({**BASE, "kernel": {"version": "6.8.12-9-pve"}})
    assert build_for("kb", package, 1, tmp_path) == (
        "kb: kernel.source is 'package' (6.8.12-9-pve); nothing to build"
    )
    remote = HostSpec.model_validate({**BASE, "artifacts": {"build_host": "builder.lan"}})
    with pytest.raises(Exception, match=r"artifacts\.build_host 'builder\.lan' is not in the"):
        build_for("kb", remote, 1, tmp_path, builders={})
    patched = {**BUILD, "build": {**BUILD["build"], "patches": ["patches/acs.patch"]}}
    spec = HostSpec.model_validate({**BASE, "kernel": patched})
    with pytest.raises(Exception, match="patches are not applied yet"):
        recipe_for("kb", spec, Path("/srv/linux-6.14"))


def test_gpuhost_build_says_what_is_wrong_with_a_tree(tmp_path, capsys):
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        "from gpuhost.spec.inventory import gpu_host\n"
        "gpu_hosts = [gpu_host('kb', ssh_hostname='192.0.2.1', spec={\n"
        f"    'kernel': {{'version': '6.14.8-2-bpo12-pve', 'source': 'build', "
        f"'build': {{'repo': '{tmp_path}/empty'}}}},\n"
        "    'driver': {'version': '595.71.05'},\n"
        f"    'artifacts': {{'store': '{tmp_path}/store'}}}})]\n"
    )
    (tmp_path / "empty").mkdir()
    assert main(["build", str(inventory), "--jobs", "1", "--work", str(tmp_path)]) == 2
    assert "no top-level Makefile" in capsys.readouterr().err


def test_a_git_url_is_cloned_at_its_ref(tmp_path):
    origin = tmp_path / "origin"
    origin.mkdir()
    (origin / "Makefile").write_text("VERSION = 6\n")
    for argv in (
        ["init", "-q", "-b", "main"],
        ["add", "Makefile"],
        ["-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "x"],
        ["tag", "v6.14"],
    ):
        subprocess.run(["git", "-C", str(origin), *argv], check=True)
    assert source_tree(str(origin), "v6.14", tmp_path) == origin  # a path is the tree itself
    # A URL is cloned into the work directory (git takes a path the same way).
    cloned = clone(str(origin), "v6.14", tmp_path / "work")
    assert (cloned / "Makefile").read_text() == "VERSION = 6\n"
    assert cloned.parent == tmp_path / "work"
    with pytest.raises(KernelBuildError, match=r"git clone of kernel\.build\.repo at 'v9' failed"):
        clone(str(origin), "v9", tmp_path / "work2")


def test_a_second_build_of_the_same_inputs_waits_for_the_first_and_finds_it(tmp_path):
    """E.g. `gpuhost build` re-run after its SSH connection dropped: the first build runs on
    there, holding the inputs' lock; the second waits, then takes what the first stored."""
    if shutil.which("gcc-12") is None:
        pytest.skip("needs gcc-12 (./gpuhost-setup installs it)")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 1\nSUBLEVEL = 1\n")
    recipe = KernelRecipe(
        tree=tree, base_config="tinyconfig", release="6.1.1-1-pve", localversion="-1-pve"
    )
    store = ArtifactStore(tmp_path / "store")
    digest = inputs_hash(recipe)
    results: list = []
    second = threading.Thread(
        target=lambda: results.append(build(recipe, store, tmp_path / "work", jobs=1))
    )
    with building(store, digest):  # the first build, running
        second.start()
        second.join(timeout=1.0)
        assert second.is_alive() and results == []  # it waits, and runs nothing meanwhile
        deb = tmp_path / "linux-image-6.1.1-1-pve_1_amd64.deb"
        deb.write_bytes(b"the first build's package")
        key = ArtifactKey("kernel", "6.1.1-1-pve", "6.1.1-1-pve", "gcc-12 (Debian) 12.2.0", "c0")
        stored = store.put(key, [deb])
        _remember(store, digest, key)
    second.join(timeout=10)
    assert results == [BuildResult(stored, cached=True)]
    assert not (tmp_path / "work").exists()  # no make, no work directory


def test_gpuhost_build_on_a_build_host_says_what_it_did(tmp_path, monkeypatch):
    """What `gpuhost build` sends the build host and prints from its answer (the real build
    over SSH: tests/build/test_build_host.py)."""
    from gpuhost.build import command as buildcmd

    sent, disconnected = [], []

    class Host:
        def disconnect(self):
            disconnected.append(True)

    def build(host, request):
        sent.append(request)
        return {"cached": len(sent) > 1, "directory": "/srv/store/kernel/x", "jobs": 8}

    monkeypatch.setattr(buildcmd.buildhost, "connect", lambda name, data: Host())
    monkeypatch.setattr(buildcmd.buildhost, "build", build)
    spec = HostSpec.model_validate(
        {**BASE, "artifacts": {"store": "/srv/store", "build_host": "b"}}
    )
    builders = {"b": {"ssh_hostname": "192.0.2.9"}}
    assert build_for("kb", spec, None, tmp_path, builders) == (
        f"kb: built {spec.kernel.version} on b (-j8) into b:/srv/store/kernel/x"
    )
    assert (
        build_for("kb", spec, 4, None, builders)
        == "kb: already in the store: b:/srv/store/kernel/x"
    )
    assert [r["jobs"] for r in sent] == [None, 4] and [r["work"] for r in sent] == [
        str(tmp_path),
        None,
    ]
    assert {r["store"] for r in sent} == {"/srv/store"} and sent[0]["repo"] == BUILD["build"][
        "repo"
    ]
    assert disconnected == [True, True]
