"""NVIDIA modules into and out of the artifact store, checked: a build is kept only when every
module says (vermagic, version, .comment) that it is the driver the Plan wants, for the Plan's
kernel, built by a GCC of that kernel's version. Builds on the control machine run here."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

from gpuhost.build.artifacts import Artifact, ArtifactKey, ArtifactStore
from gpuhost.build.driver import MODULES, BuiltModule, build_modules, source_version
from gpuhost.observe.compilers import KernelCompilers
from gpuhost.plan.driver.modules import MODULES_KIND, DriverModules
from gpuhost.plan.driver.toolchain import (
    ToolchainError,
    build_jobs,
    choose_module_compiler,
    parse_compiler,
)

MODULE_FILES = tuple(f"{m}.ko" for m in MODULES)


class DriverModulesError(RuntimeError):
    """Built or stored modules that must not be installed; the message says why and what to do."""


def modules_key(wanted: DriverModules) -> ArtifactKey | None:
    """The store key of the Plan's modules; None while the kernel's compiler is not known. The
    compiler in it is the kernel's: the modules are good for that kernel whichever host built
    them, as long as the compiler's version was the kernel's."""
    if wanted.kernel_compiler is None:
        return None
    return ArtifactKey(MODULES_KIND, wanted.version, wanted.kernel, wanted.kernel_compiler)


def check_tree(wanted: DriverModules) -> None:
    """The source tree exists and builds the Plan's driver version."""
    tree = Path(wanted.tree)
    if not (tree / "version.mk").is_file():
        raise DriverModulesError(
            f"driver.source.tree {wanted.tree}: no version.mk; point it at an "
            "open-gpu-kernel-modules checkout on the control machine"
        )
    found = source_version(tree)
    if found != wanted.version:
        raise DriverModulesError(
            f"driver.source.tree {wanted.tree} builds driver {found} but driver.version is "
            f"{wanted.version}; check out the {wanted.version} tag or change driver.version"
        )


def check_built(modules: list[BuiltModule], wanted: DriverModules) -> None:
    """Every module is for the Plan's kernel and driver, and from the kernel's GCC version."""
    assert wanted.kernel_compiler is not None
    kernel_gcc = parse_compiler(wanted.kernel_compiler)
    names = sorted(m.path.name for m in modules)
    if names != sorted(MODULE_FILES):
        raise DriverModulesError(f"the build gave {names}, not {sorted(MODULE_FILES)}")
    for m in modules:
        problems = []
        if not m.vermagic.startswith(f"{wanted.kernel} "):
            problems.append(f"vermagic {m.vermagic!r} is not for kernel {wanted.kernel}")
        if m.version != wanted.version:
            problems.append(f"version {m.version!r} is not driver.version {wanted.version}")
        try:
            built_by = parse_compiler(m.compiler)
        except ToolchainError:
            built_by = None
        if built_by != kernel_gcc:
            problems.append(f"built by {m.compiler!r}, the kernel by {wanted.kernel_compiler!r}")
        if problems:
            raise DriverModulesError(f"{m.path.name}: {'; '.join(problems)}; not stored")


def check_stored(artifact: Artifact, wanted: DriverModules) -> None:
    """A stored artifact is installed only with its manifest's vermagic for the Plan's kernel."""
    vermagic = artifact.meta.get("vermagic", "")
    if sorted(artifact.files) != sorted(MODULE_FILES) or not vermagic.startswith(
        f"{wanted.kernel} "
    ):
        raise DriverModulesError(
            f"{artifact.directory}: stored modules are not a full set for kernel "
            f"{wanted.kernel} (vermagic {vermagic!r}); remove the directory and deploy again"
        )


def store_built(
    store: ArtifactStore, key: ArtifactKey, modules: list[BuiltModule], built_on: str, cc: str
) -> Artifact:
    meta = {"vermagic": modules[0].vermagic, "compiler": modules[0].compiler}
    meta |= {"built_on": built_on, "cc": cc}
    return store.put(key, [m.path for m in modules], meta)


def local_compilers() -> dict[str, str]:
    """The control machine's compilers, read with the very fact command used on hosts."""
    fact = KernelCompilers()
    done = subprocess.run(["sh", "-c", fact.command()], capture_output=True, text=True, check=False)
    return fact.process(done.stdout.splitlines()).compilers


def build_on_control(
    wanted: DriverModules, store: ArtifactStore, out: Path, cores: int, mem_available: int
) -> Artifact | None:
    """Build here when this machine has the kernel's headers and a compiler of its version;
    None when it has not (then the host builds)."""
    key = modules_key(wanted)
    assert key is not None and wanted.kernel_compiler is not None
    headers = Path(f"/lib/modules/{wanted.kernel}/build")
    if not (headers / "Makefile").is_file():
        return None
    choice = choose_module_compiler(wanted.kernel_compiler, local_compilers())
    if choice.command is None:
        return None
    check_tree(wanted)
    jobs = build_jobs(cores, mem_available, "c")
    modules = build_modules(Path(wanted.tree), headers, choice.command, jobs, out)
    check_built(modules, wanted)
    return store_built(store, key, modules, "control machine", choice.compiler_text or "")


def source_tarball(tree: str, dest: Path) -> Path:
    """The tree as one tar (member prefix ``src/``), without objects of an earlier build."""

    def clean(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        name = info.name.rsplit("/", 1)[-1]
        skip = name.endswith((".o", ".ko", ".mod", ".mod.c", ".cmd")) or name.startswith(".git")
        return None if skip else info

    with tarfile.open(dest, "w") as tar:
        tar.add(tree, arcname="src", filter=clean)
    return dest
