"""`gpuhost build`: build the kernel a host's spec asks for into the artifact store, once.

gpuhost build inventory/kpro6.py [--host kpro6] [--jobs N] [--work DIR]

Runs on the control machine (artifacts.build_host is not applied yet). A host whose kernel
comes from a package has nothing to build; a recipe already in the store is reported with its
path and nothing is compiled.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pyinfra.api.exceptions import PyinfraError

from gpuhost.artifacts import ArtifactStore
from gpuhost.inventory import load_inventory
from gpuhost.kernelbuild import KernelBuildError, KernelRecipe, _jobs, build
from gpuhost.spec import HostSpec


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


def clone(repo: str, ref: str, work: Path) -> Path:
    """A shallow clone of ``repo`` at ``ref`` (branch or tag) under ``work``."""
    dest = work / f"src-{hashlib.sha256(repo.encode()).hexdigest()[:12]}"
    argv = ["git", "clone", "--quiet", "--depth", "1", "--branch", ref, "--", repo, str(dest)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        # git's message may quote the URL; the grammar already refused credentials in it.
        raise KernelBuildError(f"git clone of kernel.build.repo at {ref!r} failed: {done.stderr}")
    return dest


def recipe_for(name: str, spec: HostSpec, tree: Path) -> KernelRecipe:
    recipe = spec.kernel.build
    if spec.kernel.source != "build" or recipe is None:
        raise PyinfraError(f"{name}: kernel.source is 'package'; there is nothing to build")
    if recipe.patches:
        raise PyinfraError(
            f"{name}: kernel.build.patches are not applied yet; apply them to the tree and "
            "remove them from the spec"
        )
    return KernelRecipe(
        tree=tree,
        base_config=recipe.base_config,
        release=spec.kernel.version,
        localversion=recipe.localversion_for(spec.kernel.version),
        cc=f"gcc-{spec.toolchain.gcc.split('.')[0]}",
        fragment=dict(recipe.config),
    )


def build_host(name: str, spec: HostSpec, jobs: int | None, work: Path | None) -> str:
    """Build ``name``'s kernel into its store (or find it there); the line to print."""
    if spec.artifacts.build_host is not None:
        raise PyinfraError(
            f"{name}: artifacts.build_host is not applied yet; remove it to build on this machine"
        )
    if spec.kernel.source != "build" or spec.kernel.build is None:
        return f"{name}: kernel.source is 'package' ({spec.kernel.version}); nothing to build"
    store = ArtifactStore(spec.artifacts.store)
    scratch = Path(tempfile.mkdtemp(prefix="gpuhost-build-", dir=work or "/var/tmp"))
    try:
        tree = source_tree(spec.kernel.build.repo, spec.kernel.build.ref, scratch)
        result = build(recipe_for(name, spec, tree), store, scratch / "out", jobs or local_jobs())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    where = result.artifact.directory
    if result.cached:
        return f"{name}: already in the store: {where}"
    return f"{name}: built {spec.kernel.version} into {where}"


def run(args: argparse.Namespace) -> int:
    hosts = load_inventory(args.inventory)
    if args.host:
        if args.host not in hosts:
            raise PyinfraError(
                f"{args.inventory}: no host {args.host!r} (hosts: {', '.join(hosts)})"
            )
        hosts = {args.host: hosts[args.host]}
    work = Path(args.work) if args.work else None
    for name, (spec, _) in hosts.items():
        print(build_host(name, spec, args.jobs, work), flush=True)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser("build", help="build a host's kernel from source into the store")
    cmd.add_argument("inventory")
    cmd.add_argument("--host", help="only this host of the inventory")
    cmd.add_argument(
        "--jobs",
        type=int,
        help="parallel make jobs (default: min(cores, (MemAvailable - 2 GiB) / 1.5 GiB), >= 1)",
    )
    cmd.add_argument("--work", help="directory for the build's scratch space (default /var/tmp)")
    cmd.set_defaults(run=run)
