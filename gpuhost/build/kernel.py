"""Building a kernel from source into .deb packages, once, into the artifact store.

A recipe names everything the packages depend on: the source tree, the base config (a file,
or a make target such as tinyconfig), the spec's config fragment, LOCALVERSION, the compiler
and the Debian package version. The build runs out of tree (``make O=<work>/obj``), so the
source stays clean and one unpacked tree serves any number of configs; ``make bindeb-pkg``
leaves its .debs in the parent of the object directory. Every make call names ARCH for this
machine (ARCH=x86_64 on x86_64: left to the kernel, tinyconfig there makes a 32-bit kernel).

Before anything is compiled for the kernel itself, the recipe's inputs are hashed (the tree's
file list with sizes and mtimes, the config inputs, the compiler binary's bytes) and looked up
in the store's input index: a hit returns the stored packages without running make or the
compiler at all. On a miss the effective config is made (``make <base>``/``olddefconfig``,
fragment appended, ``olddefconfig`` again), every fragment entry is checked to have survived
Kconfig, ``make -s kernelrelease`` must equal the release the spec asks for, and only then
``make bindeb-pkg`` runs. What was built is read back from the build (the final .config's
CONFIG_CC_VERSION_TEXT, the .debs' own control fields), never assumed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpuhost.build.artifacts import Artifact, ArtifactKey, ArtifactStore, file_sha256
from gpuhost.spec.grammar import BASE_CONFIG_TARGETS as BASE_TARGETS

INDEX = "kernel-inputs"  # <store>/kernel-inputs/<inputs hash>.json -> the artifact's key
GIB = 1 << 30
# Memory one parallel kernel C job may need (the large translation units and LTO-less link
# steps of a distro config peak around 1-1.5 GiB), and what the machine keeps for itself.
KERNEL_JOB_BYTES = 3 * GIB // 2
RESERVE_BYTES = 2 * GIB
_CC_TEXT = re.compile(r'^CONFIG_CC_VERSION_TEXT="(?P<text>[^"\n]*)"$', re.M)
_MAKEFILE_VAR = re.compile(r"^(VERSION|PATCHLEVEL|SUBLEVEL|EXTRAVERSION)\s*=\s*(\S*)\s*$", re.M)


# The kernel's ARCH for a machine (`uname -m`). Left unset, the kernel takes ARCH from uname as
# its SUBARCH, which on x86_64 is "x86": Kconfig then asks whether to build a 64-bit kernel, and
# tinyconfig/allnoconfig answer no, so an x86_64 machine would build a 32-bit i386 kernel.
# ARCH=x86_64 makes 64BIT a fixed yes. A machine not listed here passes no ARCH.
MACHINE_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}


def machine_arch(machine: str | None = None) -> str:
    """The ARCH= a native build on this machine (or ``machine``) uses; "" for make's own."""
    return MACHINE_ARCH.get(machine if machine is not None else platform.machine(), "")


class KernelBuildError(RuntimeError):
    """The kernel build was refused or failed; the message names the cause and the fix."""


def _jobs(cores: int, mem_available: int, per_job: int = KERNEL_JOB_BYTES) -> int:
    """Parallel jobs from cores AND memory: max(1, min(cores, (MemAvailable - 2 GiB) // per_job)).

    Cores alone overcommit memory on many-core build hosts with little RAM (the OOM killer then
    takes a compiler and the build fails late). Will move to toolchain.build_jobs, shared with
    the NVIDIA module build, once that module lands.
    """
    return max(1, min(cores, (mem_available - RESERVE_BYTES) // per_job))


def mem_available(meminfo: str) -> int:
    """MemAvailable from /proc/meminfo's text, in bytes."""
    for line in meminfo.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            return int(rest.split()[0]) * 1024
    raise KernelBuildError("/proc/meminfo has no MemAvailable line")


def local_jobs() -> int:
    return _jobs(os.cpu_count() or 1, mem_available(Path("/proc/meminfo").read_text()))


def source_tree(repo: str, ref: str, work: Path) -> Path:
    """The tree to build: an absolute path as it is, a git URL cloned at ``ref`` into ``work``."""
    return Path(repo) if repo.startswith("/") else clone(repo, ref, work)


CLONE_OPTIONS = ("--quiet", "--depth", "1", "--recurse-submodules", "--shallow-submodules")


def clone(repo: str, ref: str, work: Path) -> Path:
    """A shallow clone of ``repo`` at ``ref`` (branch or tag) under ``work``, with its
    submodules (a pve-kernel tree's kernel and zfs sources are submodules)."""
    dest = work / f"src-{hashlib.sha256(repo.encode()).hexdigest()[:12]}"
    argv = ["git", "clone", *CLONE_OPTIONS, "--branch", ref, "--", repo, str(dest)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        # git's message may quote the URL; the grammar already refused credentials in it.
        raise KernelBuildError(f"git clone of kernel.build.repo at {ref!r} failed: {done.stderr}")
    return dest


@dataclass(frozen=True)
class KernelRecipe:
    tree: Path  # a kernel source tree: top-level Makefile with VERSION/PATCHLEVEL/SUBLEVEL
    base_config: str  # a BASE_TARGETS name, or an absolute path of a config file
    release: str  # what `make -s kernelrelease` must print, e.g. 6.14.8-2-bpo12-pve
    localversion: str  # appended by the kernel's setlocalversion, e.g. -2-bpo12-pve
    cc: str = "gcc-12"  # the compiler command (CC=)
    fragment: dict[str, str] = field(default_factory=dict)  # CONFIG_X -> y/m/n/number/text
    pkgversion: str = "1"  # KDEB_PKGVERSION: the .debs' Debian version
    arch: str = field(default_factory=machine_arch)  # ARCH= ("" passes none): this machine's


@dataclass(frozen=True)
class Configured:
    config: str  # the final .config
    config_hash: str
    compiler: str  # CONFIG_CC_VERSION_TEXT
    release: str


@dataclass(frozen=True)
class BuildResult:
    artifact: Artifact
    cached: bool  # True: found in the store, nothing was run


def fragment_lines(fragment: dict[str, str]) -> list[str]:
    """The fragment as .config lines. Values passed the spec's grammar (no quotes, backslashes
    or newlines), so text can be quoted as it is."""
    lines = []
    for name, value in sorted(fragment.items()):
        if value == "n":
            lines.append(f"# {name} is not set")
        elif value in ("y", "m") or re.fullmatch(r"-?[0-9]+|0x[0-9a-fA-F]+", value):
            lines.append(f"{name}={value}")
        else:
            lines.append(f'{name}="{value}"')
    return lines


def config_hash(config: str) -> str:
    """sha256 of the settings, without comment lines: the header names the tree's version and
    a date-free but tool-written title, which are not settings ('# X is not set' lines are)."""
    kept = [
        line
        for line in config.splitlines()
        if line.strip() and (not line.startswith("#") or line.endswith(" is not set"))
    ]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()


def compiler_text(config: str) -> str:
    match = _CC_TEXT.search(config)
    if not match or not match["text"]:
        raise KernelBuildError("the final .config has no CONFIG_CC_VERSION_TEXT (kernel < 5.8?)")
    return match["text"]


def tree_version(tree: Path) -> str:
    """X.Y.Z[EXTRAVERSION] from the tree's top-level Makefile (no make needed)."""
    makefile = tree / "Makefile"
    if not makefile.is_file():
        raise KernelBuildError(
            f"{tree}: no top-level Makefile; kernel.build.repo must be a kernel source tree"
        )
    found = dict(_MAKEFILE_VAR.findall(makefile.read_text(errors="replace")[:4000]))
    if not {"VERSION", "PATCHLEVEL", "SUBLEVEL"} <= found.keys():
        raise KernelBuildError(f"{makefile}: no VERSION/PATCHLEVEL/SUBLEVEL; not a kernel tree")
    return "{VERSION}.{PATCHLEVEL}.{SUBLEVEL}".format(**found) + found.get("EXTRAVERSION", "")


def _tree_fingerprint(tree: Path) -> str:
    """Every file's relative path, size and mtime, hashed (what make itself trusts). Reading
    1.3 GB of sources each time would cost seconds; tar and git keep these stable."""
    h = hashlib.sha256()
    if (tree / ".git").exists():
        # A checkout: its commit and its local changes (mtimes differ from clone to clone).
        # (Untracked files count by name only: keep sources committed or tracked.)
        for argv in (
            ["rev-parse", "HEAD"],
            ["status", "--porcelain", "--untracked-files=all"],
            ["diff", "HEAD"],
        ):
            done = subprocess.run(
                ["git", "-C", str(tree), *argv], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise KernelBuildError(f"{tree}: git {argv[0]} failed: {done.stderr.strip()}")
            h.update(done.stdout.encode())
        return "git-" + h.hexdigest()
    for top, dirs, files in os.walk(tree):
        dirs.sort()
        for name in sorted(files):
            path = Path(top, name)
            st = path.lstat()
            h.update(f"{path.relative_to(tree)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def inputs_hash(recipe: KernelRecipe) -> str:
    """A hash of everything the build reads, computed without running make or the compiler."""
    cc = shutil.which(recipe.cc)
    if cc is None:
        raise KernelBuildError(f"compiler {recipe.cc!r} not found on PATH; install it")
    base = recipe.base_config
    record = {
        "tree": _tree_fingerprint(recipe.tree),
        "base": base if base in BASE_TARGETS else file_sha256(Path(base)),
        "fragment": fragment_lines(recipe.fragment),
        "release": recipe.release,
        "localversion": recipe.localversion,
        "cc": [recipe.cc, file_sha256(Path(os.path.realpath(cc)))],
        "pkgversion": recipe.pkgversion,
        "arch": recipe.arch,
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def lookup(store: ArtifactStore, digest: str) -> Artifact | None:
    """The stored artifact these inputs built before, verified; None when there is none."""
    index = store.root / INDEX / f"{digest}.json"
    if not index.is_file():
        return None
    return store.get(ArtifactKey(**json.loads(index.read_text())))


def _remember(store: ArtifactStore, digest: str, key: ArtifactKey) -> None:
    index = store.root / INDEX / f"{digest}.json"
    index.parent.mkdir(parents=True, exist_ok=True)
    tmp = index.with_name(f".{index.name}.{os.getpid()}")
    tmp.write_text(json.dumps(key.__dict__, sort_keys=True) + "\n")
    tmp.rename(index)


def make_argv(recipe: KernelRecipe, obj: Path, *targets: str, jobs: int = 1) -> list[str]:
    # ARCH, CC and LOCALVERSION go to every make call: Kconfig records the compiler in .config,
    # the architecture decides what the config even offers and kernelrelease reads LOCALVERSION,
    # so a call without them would see another kernel.
    return [
        "make",
        "-C",
        str(recipe.tree),
        f"O={obj}",
        *([f"ARCH={recipe.arch}"] if recipe.arch else []),
        f"CC={recipe.cc}",
        f"HOSTCC={recipe.cc}",
        f"LOCALVERSION={recipe.localversion}",
        f"KDEB_PKGVERSION={recipe.pkgversion}",
        f"-j{int(jobs)}",
        *targets,
    ]


def _make(recipe: KernelRecipe, obj: Path, *targets: str, jobs: int = 1) -> str:
    argv = make_argv(recipe, obj, *targets, jobs=jobs)
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KernelBuildError(
            f"{shlex.join(argv)} failed (exit {done.returncode}):\n"
            f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done.stdout


def configure(recipe: KernelRecipe, obj: Path) -> Configured:
    """The effective config in ``obj``, checked: fragment applied, release as the spec says."""
    obj.mkdir(parents=True, exist_ok=True)
    if recipe.base_config in BASE_TARGETS:
        _make(recipe, obj, recipe.base_config)
    else:
        shutil.copyfile(recipe.base_config, obj / ".config")
        _make(recipe, obj, "olddefconfig")
    wanted = fragment_lines(recipe.fragment)
    with (obj / ".config").open("a") as f:
        f.write("".join(f"{line}\n" for line in wanted))
    _make(recipe, obj, "olddefconfig")
    config = (obj / ".config").read_text()
    have = set(config.splitlines())
    lost = [line for line in wanted if line not in have]
    if lost:
        raise KernelBuildError(
            f"kernel.build.config: Kconfig dropped {', '.join(lost)} (a dependency is off or the "
            "option does not exist in this tree); add what it depends on to the fragment"
        )
    release = _make(recipe, obj, "-s", "kernelrelease").strip()
    if release != recipe.release:
        raise KernelBuildError(
            f"the tree builds kernel release {release!r} but kernel.version is {recipe.release!r}; "
            f"point kernel.build.repo at the {recipe.release} sources or set "
            "kernel.build.localversion so the two agree"
        )
    return Configured(config, config_hash(config), compiler_text(config), release)


def plain_pve_note(release: str, files: list[str]) -> str | None:
    """What to tell the user who built a ``-pve`` release from a plain Kbuild tree: allowed
    (test kernels, hosts without ZFS), but it lacks what Proxmox's packaging adds, and deploys
    refuse it where that matters (gpuhost/build/features.py)."""
    if not release.endswith("-pve") or any(f.startswith("proxmox-kernel-") for f in files):
        return None
    return (
        f"note: {release} was built from a plain Kbuild tree (make bindeb-pkg): it has no zfs.ko "
        "and no pcie_acs_override patch, so deploys refuse it on hosts that use ZFS or set "
        "boot.acs_override. For a Proxmox kernel point kernel.build.repo at a pve-kernel tree"
    )


def _package(deb: Path, field_name: str) -> str:
    done = subprocess.run(
        ["dpkg-deb", "-f", str(deb), field_name], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@contextmanager
def building(store: ArtifactStore, digest: str) -> Iterator[None]:
    """One build of a set of inputs at a time, per store: a second `gpuhost build` of the same
    inputs (e.g. re-run after its SSH connection dropped, while the first build runs on there)
    waits for the first and then finds its result."""
    lock = store.root / INDEX / f".{digest}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_plain(recipe: KernelRecipe, store: ArtifactStore, work: Path, jobs: int) -> BuildResult:
    """Build a plain kernel tree's .debs (make bindeb-pkg) into ``store`` once; later calls
    return them without building."""
    tree_version(recipe.tree)  # a kernel tree at all: say so before hashing or making anything
    if recipe.base_config not in BASE_TARGETS and not Path(recipe.base_config).is_file():
        raise KernelBuildError(
            f"kernel.build.base_config: {recipe.base_config} is not a file on this machine"
        )
    digest = inputs_hash(recipe)
    with building(store, digest):
        found = lookup(store, digest)
        if found is not None:
            return BuildResult(found, cached=True)
        return _build(recipe, store, work, jobs, digest)


def _build(
    recipe: KernelRecipe, store: ArtifactStore, work: Path, jobs: int, digest: str
) -> BuildResult:
    if work.exists() and any(work.iterdir()):
        raise KernelBuildError(f"{work}: the work directory must be empty or absent")
    obj = work / "obj"
    done = configure(recipe, obj)
    _make(recipe, obj, "bindeb-pkg", jobs=jobs)
    wanted = {f"linux-image-{done.release}", f"linux-headers-{done.release}"}
    debs = [d for d in sorted(work.glob("*.deb")) if _package(d, "Package") in wanted]
    if {_package(d, "Package") for d in debs} != wanted:
        raise KernelBuildError(
            f"make bindeb-pkg left {[d.name for d in work.glob('*.deb')]} in {work}, "
            f"not {sorted(wanted)}"
        )
    (work / "config").write_text(done.config)
    key = ArtifactKey("kernel", done.release, done.release, done.compiler, done.config_hash)
    meta = {"inputs": digest, "fragment": fragment_lines(recipe.fragment), "jobs": jobs}
    artifact = store.put(key, [*debs, work / "config"], meta)
    _remember(store, digest, key)
    return BuildResult(artifact, cached=False)
