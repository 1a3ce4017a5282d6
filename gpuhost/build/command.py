"""`gpuhost build`: build the kernel a host's spec asks for into the artifact store, once.

gpuhost build inventory/kpro6.py [--host kpro6] [--jobs N] [--work DIR]

Runs on the control machine, or (artifacts.build_host) on the build host the inventory declares,
over SSH (gpuhost/build/host.py). A host whose kernel comes from a package has nothing to build;
a recipe already in the store is reported with its path and nothing is compiled.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyinfra.api.exceptions import PyinfraError

from gpuhost.build import host as buildhost
from gpuhost.build.artifacts import ArtifactStore
from gpuhost.build.kernel import KernelRecipe, local_jobs, plain_pve_note, source_tree
from gpuhost.build.kernelbuild import build
from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import load_hosts


def recipe_fields(name: str, spec: HostSpec) -> dict[str, Any]:
    """The KernelRecipe fields a spec sets (all but the tree, which the building machine finds,
    and ARCH, which is that machine's)."""
    recipe = spec.kernel.build
    if spec.kernel.source != "build" or recipe is None:
        raise PyinfraError(f"{name}: kernel.source is 'package'; there is nothing to build")
    if recipe.patches:
        raise PyinfraError(
            f"{name}: kernel.build.patches are not applied yet; apply them to the tree and "
            "remove them from the spec"
        )
    return {
        "base_config": recipe.base_config,
        "release": spec.kernel.version,
        "localversion": recipe.localversion_for(spec.kernel.version),
        "cc": f"gcc-{spec.toolchain.gcc.split('.')[0]}",
        "fragment": dict(recipe.config),
    }


def recipe_for(name: str, spec: HostSpec, tree: Path) -> KernelRecipe:
    return KernelRecipe(tree=tree, **recipe_fields(name, spec))


def build_for(
    name: str,
    spec: HostSpec,
    jobs: int | None,
    work: Path | None,
    builders: dict[str, dict[str, Any]] | None = None,
) -> str:
    """Build ``name``'s kernel into its store (or find it there); the line to print.
    ``builders``: the inventory's build hosts (name -> host data), for artifacts.build_host."""
    if spec.kernel.source != "build" or spec.kernel.build is None:
        return f"{name}: kernel.source is 'package' ({spec.kernel.version}); nothing to build"
    if spec.artifacts.build_host is not None:
        return _build_remote(name, spec, jobs, work, builders or {})
    store = ArtifactStore(spec.artifacts.store)
    scratch = Path(tempfile.mkdtemp(prefix="gpuhost-build-", dir=work or "/var/tmp"))
    try:
        tree = source_tree(spec.kernel.build.repo, spec.kernel.build.ref, scratch)
        result = build(recipe_for(name, spec, tree), store, scratch / "out", jobs or local_jobs())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    where = result.artifact.directory
    _note(name, spec.kernel.version, list(result.artifact.files))
    if result.cached:
        return f"{name}: already in the store: {where}"
    return f"{name}: built {spec.kernel.version} into {where}"


def _build_remote(
    name: str,
    spec: HostSpec,
    jobs: int | None,
    work: Path | None,
    builders: dict[str, dict[str, Any]],
) -> str:
    builder = spec.artifacts.build_host
    assert spec.kernel.build is not None and builder is not None
    if builder not in builders:  # load_hosts checked it; a caller passing its own may not have
        raise PyinfraError(f"{name}: artifacts.build_host {builder!r} is not in the inventory")
    host = buildhost.connect(builder, builders[builder])
    try:
        answer = buildhost.build(
            host,
            {
                "repo": spec.kernel.build.repo,
                "ref": spec.kernel.build.ref,
                "recipe": recipe_fields(name, spec),
                "store": spec.artifacts.store,
                "work": str(work) if work else None,
                "jobs": jobs,
            },
        )
    finally:
        host.disconnect()
    where = f"{builder}:{answer['directory']}"
    _note(name, spec.kernel.version, list(answer.get("files", [])))
    if answer["cached"]:
        return f"{name}: already in the store: {where}"
    return f"{name}: built {spec.kernel.version} on {builder} (-j{answer['jobs']}) into {where}"


def _note(name: str, release: str, files: list[str]) -> None:
    note = plain_pve_note(release, files)
    if note:
        print(f"{name}: {note}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    hosts, builders = load_hosts(args.inventory)
    if args.host:
        if args.host not in hosts:
            raise PyinfraError(
                f"{args.inventory}: no host {args.host!r} (hosts: {', '.join(hosts)})"
            )
        hosts = {args.host: hosts[args.host]}
    work = Path(args.work) if args.work else None
    for name, (spec, _) in hosts.items():
        print(build_for(name, spec, args.jobs, work, builders), flush=True)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser(
        "build",
        help="build a host's kernel from source into the store (here, or on its build host)",
    )
    cmd.add_argument("inventory")
    cmd.add_argument("--host", help="only this host of the inventory")
    cmd.add_argument(
        "--jobs",
        type=int,
        help="parallel make jobs (default, from the machine that builds: min(cores, "
        "(MemAvailable - 2 GiB) / 1.5 GiB), >= 1)",
    )
    cmd.add_argument(
        "--work",
        help="directory for the build's scratch space, on the machine that builds (default /var/tmp)",
    )
    cmd.set_defaults(run=run)
