"""The Plan's NVIDIA modules and the checks around the store, with real builds where a build is
involved (the stand-in tree against this machine's Debian headers, gcc-12)."""

from __future__ import annotations

import re
import shutil
import tarfile
from pathlib import Path

import pytest

from gpuhost.build.artifacts import ArtifactStore
from gpuhost.build.driver import MODULES, build_modules
from gpuhost.build.driverstore import (
    DriverModulesError,
    build_on_control,
    check_built,
    check_stored,
    check_tree,
    modules_key,
    source_tarball,
    store_built,
)
from gpuhost.observe.driver_install import PENDING, parse_build_resources, parse_module_hashes
from gpuhost.plan.driver.modules import DriverModules
from gpuhost.plan.make import make_plan
from gpuhost.spec.host import HostSpec
from tests.unit.buildtools import missing_module_build
from tests.unit.hosts import kpro6

TREE = Path(__file__).parents[1] / "fixtures/driver-src/open-gpu-kernel-modules"
HEADERS = sorted(Path("/lib/modules").glob("*/build/.config"))
SPEC = {"kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "595.71.05"}}
SOURCE = {"tree": str(TREE), "store": "/var/cache/gpuhost-store"}
KPRO6_COMPILERS = [
    "== kernel 6.8.12-9-pve boot",
    'CONFIG_CC_VERSION_TEXT="gcc (Debian 12.2.0-14) 12.2.0"',
    "== compiler gcc-12 /usr/bin/gcc-12",
    "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0",
]


def plan_for(spec: dict, compilers: list[str]):
    return make_plan("kpro6", HostSpec.model_validate(spec), kpro6(KernelCompilers=(0, compilers)))


def test_without_a_source_the_modules_are_not_managed() -> None:
    assert plan_for(SPEC, KPRO6_COMPILERS).driver_modules is None


def test_the_plan_names_kernel_key_and_the_hosts_compiler() -> None:
    spec = {**SPEC, "driver": {**SPEC["driver"], "source": SOURCE}}
    wanted = plan_for(spec, KPRO6_COMPILERS).driver_modules
    assert wanted is not None
    assert wanted.install_dir == "/lib/modules/6.8.12-9-pve/updates/gpuhost"
    key = modules_key(wanted)
    assert key is not None and key.compiler == "gcc (Debian 12.2.0-14) 12.2.0"
    assert key.path.parts[:3] == ("nvidia-modules", "595.71.05", "6.8.12-9-pve")
    assert wanted.on_host is not None and wanted.on_host.command == "gcc-12"


def test_a_kernel_without_config_has_no_key_and_gcc11_is_refused() -> None:
    spec = {**SPEC, "driver": {**SPEC["driver"], "source": SOURCE}}
    assert modules_key(plan_for(spec, KPRO6_COMPILERS[2:]).driver_modules) is None
    only_11 = [
        *KPRO6_COMPILERS[:2],
        "== compiler gcc-11 /usr/bin/gcc-11",
        "gcc-11 (Debian 11.3.0-12) 11.3.0",
    ]
    choice = plan_for(spec, only_11).driver_modules.on_host
    assert choice.command is None and "gcc-11 (Debian 11.3.0-12) 11.3.0" in choice.refusal


def wanted_for(kernel: str, compiler: str, version: str = "595.71.05") -> DriverModules:
    return DriverModules(version, kernel, str(TREE), "/unused", compiler, None)


def test_the_tree_must_build_the_planned_version(tmp_path: Path) -> None:
    check_tree(wanted_for("6.1.0-1-amd64", "gcc-12 (x) 12.2.0"))
    with pytest.raises(
        DriverModulesError, match=re.escape("builds driver 595.71.05 but driver.version is 580")
    ):
        check_tree(wanted_for("6.1.0-1-amd64", "gcc-12 (x) 12.2.0", "580.95.05"))
    empty = DriverModules("595.71.05", "k", str(tmp_path), "/unused", "gcc (x) 12.2.0", None)
    with pytest.raises(DriverModulesError, match=re.escape("no version.mk")):
        check_tree(empty)


def test_the_tarball_leaves_build_objects_out(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(TREE, tree)
    (tree / "kernel-open/nvidia.o").write_bytes(b"obj")
    (tree / "kernel-open/nvidia.ko").write_bytes(b"ko")
    with tarfile.open(source_tarball(str(tree), tmp_path / "src.tar")) as tar:
        names = tar.getnames()
    assert "src/kernel-open/nvidia.c" in names and "src/version.mk" in names
    assert not [n for n in names if n.endswith((".o", ".ko"))]


@pytest.mark.parametrize(
    "lines,expected",
    [
        ([], {}),
        (
            [f"{'a' * 64}  /lib/modules/k/updates/gpuhost/nvidia.ko", PENDING],
            {"nvidia.ko": "a" * 64, PENDING: ""},
        ),
    ],
)
def test_module_hashes(lines: list[str], expected: dict[str, str]) -> None:
    assert parse_module_hashes(lines) == expected


def test_module_hashes_and_resources_refuse_what_they_do_not_know() -> None:
    with pytest.raises(Exception, match="installed module hashes"):
        parse_module_hashes(["sha256sum: x: No such file"])
    assert parse_build_resources(["16", "MemAvailable:   131428456 kB"]) == (16, 131428456 * 1024)
    with pytest.raises(Exception, match="not a MemAvailable line"):
        parse_build_resources(["16", "MemFree: 1 kB"])


@pytest.fixture(scope="module")
def local() -> tuple[str, str]:
    """This machine's kernel headers (release, CONFIG_CC_VERSION_TEXT) for real builds."""
    problem = missing_module_build(HEADERS)
    if problem:
        pytest.skip(problem)
    config = HEADERS[-1]
    text = next(
        line.split("=", 1)[1].strip('"')
        for line in config.read_text().splitlines()
        if line.startswith("CONFIG_CC_VERSION_TEXT=")
    )
    return config.parent.parent.name, text


def test_a_build_on_the_control_machine_is_checked_and_stored(local, tmp_path: Path) -> None:
    kernel, cc_text = local
    wanted = DriverModules("595.71.05", kernel, str(TREE), str(tmp_path / "s"), cc_text, None)
    store = ArtifactStore(wanted.store)
    artifact = build_on_control(wanted, store, tmp_path / "out", cores=2, mem_available=8 << 30)
    assert artifact is not None and sorted(artifact.files) == sorted(f"{m}.ko" for m in MODULES)
    assert artifact.meta["built_on"] == "control machine"
    assert artifact.meta["vermagic"].startswith(f"{kernel} SMP")
    again = store.get(modules_key(wanted))
    check_stored(again, wanted)
    other = DriverModules("595.71.05", "6.8.12-9-pve", str(TREE), wanted.store, cc_text, None)
    assert build_on_control(other, store, tmp_path / "o2", 2, 8 << 30) is None  # no headers here
    with pytest.raises(
        DriverModulesError, match=re.escape("not a full set for kernel 6.8.12-9-pve")
    ):
        check_stored(again, other)


def test_modules_from_another_compiler_or_kernel_are_not_stored(
    local, driver_built, tmp_path: Path
) -> None:
    kernel, cc_text = local
    headers, modules = driver_built  # built from TREE with gcc-12 (tests/unit/conftest.py)
    build = Path(f"/lib/modules/{kernel}/build")
    if headers.resolve() != build.resolve():  # that build was for other headers than these
        modules = build_modules(TREE, build, "gcc-12", 2, tmp_path)
    check_built(modules, wanted_for(kernel, cc_text))
    gcc11_kernel = wanted_for(kernel, "gcc-11 (Debian 11.3.0-12) 11.3.0")
    with pytest.raises(
        DriverModulesError, match=r"built by 'GCC: \(Debian 12.2.0.*the kernel by 'gcc-11"
    ):
        check_built(modules, gcc11_kernel)
    with pytest.raises(DriverModulesError, match=re.escape("is not for kernel 6.8.12-9-pve")):
        check_built(modules, wanted_for("6.8.12-9-pve", cc_text))
    with pytest.raises(DriverModulesError, match=re.escape("not driver.version 580.95.05")):
        check_built(modules, wanted_for(kernel, cc_text, "580.95.05"))
    with pytest.raises(DriverModulesError, match="the build gave"):
        check_built(modules[:2], wanted_for(kernel, cc_text))
    store = ArtifactStore(tmp_path / "store")
    key = modules_key(wanted_for(kernel, cc_text))
    stored = store_built(store, key, modules, "twin", "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0")
    assert store.get(key).meta == stored.meta and stored.meta["cc"].startswith("gcc-12")
