"""Build any kernel tree a recipe names: a pve-kernel tree through its own packaging
(gpuhost/build/pvekernel.py), any other through Kbuild's bindeb-pkg (gpuhost/build/kernel.py)."""

from __future__ import annotations

from pathlib import Path

from gpuhost.build.artifacts import ArtifactStore
from gpuhost.build.kernel import BuildResult, KernelRecipe, build_plain
from gpuhost.build.pvekernel import build_pve, is_pve_tree


def build(recipe: KernelRecipe, store: ArtifactStore, work: Path, jobs: int) -> BuildResult:
    """Build the recipe's .debs into ``store`` once; later calls return them without building."""
    if is_pve_tree(recipe.tree):
        return build_pve(recipe, store, work, jobs)
    return build_plain(recipe, store, work, jobs)
