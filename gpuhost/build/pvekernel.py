"""Building a Proxmox kernel the Proxmox way: a pve-kernel tree through its own packaging.

A pve-kernel tree (proxmox/pve-kernel) is not a kernel tree: its top-level Makefile names the
release (KVNAME = KERNEL_VER-KREL KREL_EXTRA -pve) and prepares BUILD_DIR from its submodules
(the kernel source copied from submodules/ubuntu-kernel, its config exported, EXTRAVERSION set,
patches/kernel/*.patch applied: among them the pcie_acs_override one; zfs prepared from
submodules/zfsonlinux by `make kernel`); then dpkg-buildpackage in BUILD_DIR runs debian/rules,
which applies its own config options (scripts/config + olddefconfig), compiles the kernel and
zfs.ko/spl.ko, installs them under usr/lib/modules/KVNAME (zfs/ for ZFS), runs depmod and packs
proxmox-kernel-KVNAME and proxmox-headers-KVNAME (pve-kernel bookworm-6.14: Makefile, the
$(BUILD_DIR).prepared, $(KERNEL_SRC).prepared, $(ZFSDIR).prepared and $(DST_DEB) rules;
debian/rules .config_mark, .install_mark, $(MODULES)/zfs.ko).

gpuhost runs those steps as the tree defines them, in a copy of the tree under the work
directory (the packaging writes into its tree), and adds only what the spec asks:
- the release: the tree's own KVNAME (`make print-KVNAME`) must equal kernel.version before
  anything is prepared; a user aligns them through KREL/KREL_EXTRA in the tree's Makefile, or
  sets kernel.version to the tree's KVNAME;
- the config: kernel.build.base_config left at its default keeps the tree's own config; a
  config file replaces it; the spec's fragment is appended to BUILD_DIR's kernel .config after
  the tree prepared it, so debian/rules' options and olddefconfig run over it, and every
  fragment line must be in the built kernel's config (a packaging option that overrides one is
  refused by name);
- the compiler: CC= and HOSTCC= on the top-level make's command line, which GNU make passes
  to every sub-make through MAKEFLAGS (dpkg-buildpackage -> debian/rules -> $(MAKE)) and exports
  to the environment (zfs's configure reads CC there);
- jobs: DEB_BUILD_OPTIONS=parallel=N, which debian/rules turns into -jN (a -j on the top-level
  make would not reach past dpkg-buildpackage).
Only proxmox-kernel-KVNAME and proxmox-headers-KVNAME are stored (not the meta, tools or
signing-template packages), after they are read back: their control fields, the kernel's
config (CONFIG_CC_VERSION_TEXT, the fragment) and zfs.ko and the ACS patch's symbol
(gpuhost/build/features.py). A package without them is refused, never stored.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from gpuhost.build.artifacts import ArtifactKey, ArtifactStore
from gpuhost.build.debinfo import data_tar
from gpuhost.build.features import package_features
from gpuhost.build.kernel import (
    BuildResult,
    KernelBuildError,
    KernelRecipe,
    _package,
    _remember,
    building,
    compiler_text,
    config_hash,
    fragment_lines,
    inputs_hash,
    lookup,
)

# What the tree's Makefile must define: the names gpuhost reads to find and check the build.
VARIABLES = ("KVNAME", "BUILD_DIR", "KERNEL_SRC", "DST_DEB", "HDR_DEB", "PACKAGE", "HDRPACKAGE")
PRINT_RULE = "print-%: ; @echo '$*=$($*)'"
_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9._+-]*")  # one path component, not . or ..
DEFAULT_BASE = "defconfig"  # the spec's default: keep the tree's own config


def is_pve_tree(tree: Path) -> bool:
    """A pve-kernel tree: its Makefile names KVNAME, debian/rules packs it, and the kernel and
    zfs submodules are there (a checkout without `--recurse-submodules` is not buildable)."""
    makefile = tree / "Makefile"
    if not makefile.is_file() or not (tree / "debian/rules").is_file():
        return False
    if not any(
        line.startswith("KVNAME") for line in makefile.read_text(errors="replace").split("\n")
    ):
        return False
    return (tree / "submodules/ubuntu-kernel").is_dir() and (
        tree / "submodules/zfsonlinux"
    ).is_dir()


def tree_variables(tree: Path) -> dict[str, str]:
    """The Makefile's own values of VARIABLES (make evaluates them; nothing is built)."""
    argv = ["make", "-s", "-C", str(tree), "--eval", PRINT_RULE]
    argv += [f"print-{name}" for name in VARIABLES]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KernelBuildError(
            f"{tree}: make could not read the pve-kernel Makefile:\n{done.stderr[-2000:]}"
        )
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    empty = [name for name in VARIABLES if not found.get(name)]
    if empty:
        raise KernelBuildError(
            f"{tree}/Makefile defines no {', '.join(empty)}; not a pve-kernel tree"
        )
    odd = [n for n in VARIABLES if not _NAME.fullmatch(found[n])]
    if odd:
        raise KernelBuildError(
            f"{tree}/Makefile: {', '.join(f'{n}={found[n]!r}' for n in odd)} is not a plain file "
            "name (letters, digits, . _ + -); gpuhost builds only inside the tree's copy"
        )
    return found


def check_recipe(recipe: KernelRecipe, kvname: str) -> None:
    """Refuse, before anything is prepared, what this packaging cannot honour."""
    if kvname != recipe.release:
        raise KernelBuildError(
            f"the pve-kernel tree builds kernel release {kvname!r} (its Makefile's KVNAME) but "
            f"kernel.version is {recipe.release!r}; set kernel.version to {kvname!r}, or change "
            "KREL/KREL_EXTRA (and KERNEL_MAJ/MIN/PATCHLEVEL) in the tree's Makefile so the two agree"
        )
    base = recipe.base_config
    if base != DEFAULT_BASE and not base.startswith("/"):
        raise KernelBuildError(
            f"kernel.build.base_config {base!r}: a pve-kernel tree configures its kernel itself; "
            "leave base_config out (the tree's config) or give a config file to replace it"
        )


def _run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise KernelBuildError(
            f"{' '.join(argv)} failed (exit {done.returncode}):\n"
            f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )


def copy_tree(tree: Path, dest: Path, build_dir: str) -> Path:
    """The tree, to build in. Hard links where the file system allows: the packaging only
    writes new files outside BUILD_DIR (markers, BUILD_DIR itself), and BUILD_DIR is its own
    copy; an earlier build's markers, packages and BUILD_DIR are left out so every step runs."""
    try:
        _run(["cp", "-al", str(tree), str(dest)])
    except KernelBuildError:
        shutil.rmtree(dest, ignore_errors=True)
        _run(["cp", "-a", str(tree), str(dest)])
    for stale in (*dest.glob("*.prepared"), *dest.glob("*.deb")):
        stale.unlink()
    shutil.rmtree(dest / build_dir, ignore_errors=True)
    return dest


def _inputs(recipe: KernelRecipe) -> str:
    return hashlib.sha256(f"pve-kernel packaging\0{inputs_hash(recipe)}".encode()).hexdigest()


def build_pve(recipe: KernelRecipe, store: ArtifactStore, work: Path, jobs: int) -> BuildResult:
    """Build the pve-kernel tree's two packages into ``store`` once (later: found there)."""
    names = tree_variables(recipe.tree)
    check_recipe(recipe, names["KVNAME"])
    digest = _inputs(recipe)
    with building(store, digest):
        found = lookup(store, digest)
        if found is not None:
            return BuildResult(found, cached=True)
        if work.exists() and any(work.iterdir()):
            raise KernelBuildError(f"{work}: the work directory must be empty or absent")
        work.mkdir(parents=True, exist_ok=True)
        debs, config = _package_tree(
            recipe, copy_tree(recipe.tree, work / "tree", names["BUILD_DIR"]), names, jobs
        )
        (work / "config").write_text(config)
        key = ArtifactKey(
            "kernel", recipe.release, recipe.release, compiler_text(config), config_hash(config)
        )
        meta = {
            "inputs": digest,
            "packaging": "pve-kernel",
            "fragment": fragment_lines(recipe.fragment),
            "jobs": jobs,
        }
        artifact = store.put(key, [*debs, work / "config"], meta)
        _remember(store, digest, key)
        return BuildResult(artifact, cached=False)


def _package_tree(
    recipe: KernelRecipe, tree: Path, names: dict[str, str], jobs: int
) -> tuple[list[Path], str]:
    make = ["make", "-C", str(tree), f"CC={recipe.cc}", f"HOSTCC={recipe.cc}"]
    env = {**os.environ, "DEB_BUILD_OPTIONS": f"parallel={int(jobs)}"}
    _run([*make, f"{names['BUILD_DIR']}.prepared"], env=env)
    kernel_config = tree / names["BUILD_DIR"] / names["KERNEL_SRC"] / ".config"
    if recipe.base_config.startswith("/"):
        shutil.copyfile(recipe.base_config, kernel_config)
    wanted = fragment_lines(recipe.fragment)
    with kernel_config.open("a") as f:
        f.write("".join(f"{line}\n" for line in wanted))
    _run([*make, names["DST_DEB"]], env=env)
    debs = [tree / names["DST_DEB"], tree / names["HDR_DEB"]]
    return debs, verify(debs, names, recipe.release, wanted)


def verify(debs: list[Path], names: dict[str, str], release: str, wanted: list[str]) -> str:
    """The built kernel's config, after the packages proved to be what the spec asked for:
    the two packages by name, the fragment in the config, zfs.ko and the ACS patch."""
    packages = {names["PACKAGE"]: debs[0], names["HDRPACKAGE"]: debs[1]}
    for package, deb in packages.items():
        if not deb.is_file():
            left = sorted(p.name for p in deb.parent.glob("*.deb"))
            raise KernelBuildError(f"the pve-kernel packaging left {left}, not {deb.name}")
        if _package(deb, "Package") != package:
            raise KernelBuildError(
                f"{deb.name} is package {_package(deb, 'Package')!r}, not {package!r}"
            )
    image = debs[0]
    config = member_text(image, f"boot/config-{release}")
    have = set(config.splitlines())
    lost = [line for line in wanted if line not in have]
    if lost:
        raise KernelBuildError(
            f"kernel.build.config: the built kernel's config lacks {', '.join(lost)} (the tree's "
            "packaging sets it otherwise, or a dependency is off); change the fragment or the "
            "tree's debian/rules config options"
        )
    features = package_features(image, release)
    if not features.zfs or not features.acs_override:
        lacking = [
            what
            for what, ok in (
                ("zfs.ko", features.zfs),
                ("the pcie_acs_override patch", features.acs_override),
            )
            if not ok
        ]
        raise KernelBuildError(
            f"{image.name} lacks {' and '.join(lacking)}: the tree's packaging did not build what "
            "a Proxmox kernel carries (its zfsonlinux submodule, patches/kernel); not stored"
        )
    return config


def member_text(deb: Path, name: str) -> str:
    """One file of a package's data, as text."""
    with data_tar(deb) as tar:
        for member in tar:
            if member.name.removeprefix("./") == name and member.isfile():
                extracted = tar.extractfile(member)
                return extracted.read().decode(errors="replace") if extracted else ""
    raise KernelBuildError(f"{deb.name} has no {name}")
