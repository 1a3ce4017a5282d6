"""Which trees take the Proxmox packaging path, and what it refuses before anything is prepared
(gpuhost.build.pvekernel); make reads the stand-in's real Makefile, nothing is compiled."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuhost.build.artifacts import ArtifactStore
from gpuhost.build.kernel import (
    CLONE_OPTIONS,
    KernelBuildError,
    KernelRecipe,
    plain_pve_note,
)
from gpuhost.build.kernelbuild import build
from gpuhost.build.pvekernel import is_pve_tree, tree_variables, verify
from tests.build.pvekernel_standin import write_standin
from tests.kerneldebs import headers_deb, kernel_deb

RELEASE = "6.1.192-2-pve"


@pytest.fixture
def standin(tmp_path) -> Path:
    """The stand-in's packaging on a kernel tree of two files (enough for make to read it)."""
    kernel = tmp_path / "linux"
    (kernel / "init").mkdir(parents=True)
    (kernel / "Makefile").write_text(
        "VERSION = 6\nPATCHLEVEL = 1\nSUBLEVEL = 192\nEXTRAVERSION =\n"
    )
    (kernel / "init/main.c").write_text("void start_kernel(void)\n{\n}\n")
    return write_standin(tmp_path / "pve-kernel", kernel)


def recipe(tree: Path, **changes) -> KernelRecipe:
    fields = dict(tree=tree, base_config="defconfig", release=RELEASE, localversion="-2-pve")
    return KernelRecipe(**{**fields, **changes})


def test_a_pve_kernel_tree_is_told_from_a_plain_one(standin, tmp_path):
    assert is_pve_tree(standin)
    assert not is_pve_tree(tmp_path / "linux")  # a kernel tree: the plain Kbuild path
    (standin / "submodules/zfsonlinux/Makefile").unlink()
    (standin / "submodules/zfsonlinux/upstream").rename(tmp_path / "zfs")
    (standin / "submodules/zfsonlinux").rmdir()  # cloned without its submodules
    assert not is_pve_tree(standin)


def test_the_release_and_package_names_come_from_the_trees_make(standin):
    names = tree_variables(standin)
    assert names["KVNAME"] == RELEASE
    assert names["BUILD_DIR"] == "proxmox-kernel-6.1.192"
    assert names["PACKAGE"] == f"proxmox-kernel-{RELEASE}"
    assert names["HDR_DEB"].startswith(f"proxmox-headers-{RELEASE}_6.1.192-2_")


def test_another_release_is_refused_saying_how_to_align_them(standin, tmp_path):
    with pytest.raises(KernelBuildError) as err:
        build(
            recipe(standin, release="6.1.192-3-pve"),
            ArtifactStore(tmp_path / "s"),
            tmp_path / "w",
            1,
        )
    assert f"builds kernel release {RELEASE!r} (its Makefile's KVNAME)" in str(err.value)
    assert "KREL/KREL_EXTRA" in str(err.value)
    assert not (tmp_path / "w").exists() and not (standin / "proxmox-kernel-6.1.192").exists()


def test_a_base_config_target_is_refused_a_file_is_taken(standin, tmp_path):
    with pytest.raises(KernelBuildError, match="configures its kernel itself"):
        build(
            recipe(standin, base_config="tinyconfig"),
            ArtifactStore(tmp_path / "s"),
            tmp_path / "w",
            1,
        )


def test_a_plain_tree_building_a_pve_release_is_told_what_it_lacks():
    note = plain_pve_note("6.1.192-1-pve", ["linux-image-6.1.192-1-pve_1_amd64.deb", "config"])
    assert note is not None and "no zfs.ko and no pcie_acs_override patch" in note
    assert plain_pve_note("6.1.192-1-custom", ["linux-image-x.deb"]) is None
    assert plain_pve_note(RELEASE, [f"proxmox-kernel-{RELEASE}_1_amd64.deb"]) is None


def test_git_repos_are_cloned_with_their_submodules(tmp_path):
    """A real clone of a repo with a submodule, with the options gpuhost clones with."""

    def git(*args: str, cwd: Path) -> None:
        subprocess.run(
            ["git", "-c", "protocol.file.allow=always", *args],
            cwd=cwd,
            check=True,
            capture_output=True,
        )

    for name in ("zfs", "top"):
        (tmp_path / name).mkdir()
        git("init", "-q", "-b", "main", cwd=tmp_path / name)
        (tmp_path / name / "README").write_text(name)
        git("add", "README", cwd=tmp_path / name)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", name, cwd=tmp_path / name)
    git(
        "submodule",
        "add",
        "-q",
        str(tmp_path / "zfs"),
        "submodules/zfsonlinux",
        cwd=tmp_path / "top",
    )
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "sub", cwd=tmp_path / "top")
    dest = tmp_path / "clone"
    git(
        "clone",
        *CLONE_OPTIONS,
        "--branch",
        "main",
        f"file://{tmp_path / 'top'}",
        str(dest),
        cwd=tmp_path,
    )
    assert (dest / "submodules/zfsonlinux/README").read_text() == "zfs"


def test_a_build_dir_outside_the_tree_is_refused(standin):
    makefile = standin / "Makefile"
    makefile.write_text(makefile.read_text().replace("BUILD_DIR=proxmox-kernel-", "BUILD_DIR=../"))
    with pytest.raises(KernelBuildError, match=r"BUILD_DIR='\.\./6\.1\.192' is not a plain file"):
        tree_variables(standin)


def built(tmp_path: Path, zfs: bool, acs: bool) -> tuple[list[Path], dict[str, str]]:
    """What the packaging left, as real packages (tests/kerneldebs.py), and the tree's names."""
    debs = [
        kernel_deb(tmp_path, RELEASE, zfs=zfs, acs=acs, proxmox=True),
        headers_deb(tmp_path, RELEASE, proxmox=True),
    ]
    names = {"PACKAGE": f"proxmox-kernel-{RELEASE}", "HDRPACKAGE": f"proxmox-headers-{RELEASE}"}
    return debs, names


def test_packages_without_zfs_or_the_acs_patch_are_not_stored(tmp_path):
    debs, names = built(tmp_path / "ok", zfs=True, acs=True)
    assert "CONFIG_MODULES=y" in verify(debs, names, RELEASE, ["CONFIG_MODULES=y"])
    debs, names = built(tmp_path / "nozfs", zfs=False, acs=True)
    with pytest.raises(KernelBuildError, match=r"lacks zfs\.ko: .*not stored"):
        verify(debs, names, RELEASE, [])
    debs, names = built(tmp_path / "noacs", zfs=True, acs=False)
    with pytest.raises(KernelBuildError, match="lacks the pcie_acs_override patch"):
        verify(debs, names, RELEASE, [])


def test_a_fragment_line_the_packaging_overrode_is_refused_by_name(tmp_path):
    debs, names = built(tmp_path, zfs=True, acs=True)
    with pytest.raises(KernelBuildError, match=r"config lacks CONFIG_PRINTK=y"):
        verify(debs, names, RELEASE, ["CONFIG_MODULES=y", "CONFIG_PRINTK=y"])
    debs[1].rename(tmp_path / "elsewhere.deb")
    with pytest.raises(KernelBuildError, match=f"not proxmox-headers-{RELEASE}"):
        verify(debs, names, RELEASE, [])
