"""Build a kernel recipe into the artifact store, by the kind of tree it names: a pve-kernel
tree through Proxmox's own packaging (pvekernel.py), any other kernel tree through the kernel's
``make bindeb-pkg`` (kernel.py)."""

from __future__ import annotations

from pathlib import Path

from gpuhost.build.artifacts import ArtifactStore
from gpuhost.build.kernel import BuildResult, KernelRecipe, build_upstream
from gpuhost.build.pvekernel import build_pve, is_pve_tree


def build(recipe: KernelRecipe, store: ArtifactStore, work: Path, jobs: int) -> BuildResult:
    """The recipe's .debs, built once; later calls return them without building."""
    if is_pve_tree(recipe.tree):
        return build_pve(recipe, store, work, jobs)
    return build_upstream(recipe, store, work, jobs)
