"""Which stored kernel a host installs (gpuhost.build.kernelstore), on a real store directory."""

from __future__ import annotations

import pytest

from gpuhost.build.artifacts import ArtifactKey, ArtifactStore
from gpuhost.build.features import package_features
from gpuhost.build.kernelstore import (
    KernelStoreError,
    installed_problem,
    plan_install,
    stored_kernel,
)
from tests.kerneldebs import headers_deb, kernel_deb

RELEASE = "6.14.8-2-bpo12-pve"
GCC12 = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"
GCC13 = "gcc (Debian 13.3.0-1) 13.3.0"


def put(store: ArtifactStore, tmp_path, compiler: str, config: str, names: list[str]):
    files = []
    for name in names:
        f = tmp_path / "src" / config / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(f"{compiler} {config} {name}".encode())
        files.append(f)
    return store.put(ArtifactKey("kernel", RELEASE, RELEASE, compiler, config), files)


DEBS = [
    f"linux-headers-{RELEASE}_{RELEASE}-1_amd64.deb",
    f"linux-image-{RELEASE}_{RELEASE}-1_amd64.deb",
    "config",
]


def test_the_build_by_the_toolchains_gcc_is_taken_image_first(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    put(store, tmp_path, GCC13, "c13", DEBS)
    put(store, tmp_path, GCC12, "c12", DEBS)
    assert {k.compiler for k in store.keys("kernel", RELEASE, RELEASE)} == {GCC12, GCC13}
    install = plan_install(RELEASE, "build", "12.2.0", store)
    assert install.compiler == GCC12
    assert [d.rsplit("/", 1)[-1] for d in install.debs] == [DEBS[1], DEBS[0]]
    assert all("/c12/" in d for d in install.debs)
    assert "from the store, built by gcc (Debian 12.2.0" in install.describe()


def test_an_empty_store_says_how_to_fill_it(tmp_path):
    with pytest.raises(KernelStoreError, match=r"not in the artifact store .*gpuhost build"):
        stored_kernel(ArtifactStore(tmp_path / "none"), RELEASE, "12.2.0")


def test_only_another_compilers_build_is_refused_naming_it(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    put(store, tmp_path, GCC13, "c13", DEBS)
    with pytest.raises(KernelStoreError) as err:
        stored_kernel(store, RELEASE, "12.2.0")
    assert GCC13 in str(err.value) and "not by gcc 12.2.0 (toolchain.gcc)" in str(err.value)


def test_two_configs_by_one_compiler_are_not_guessed_between(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    put(store, tmp_path, GCC12, "aaaa", DEBS)
    put(store, tmp_path, GCC12, "bbbb", DEBS)
    with pytest.raises(KernelStoreError, match=r"from 2 configs \(aaaa, bbbb\)"):
        stored_kernel(store, RELEASE, "12.2.0")


def test_a_changed_file_is_refused(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    artifact = put(store, tmp_path, GCC12, "c12", DEBS)
    artifact.file(DEBS[1]).write_bytes(b"truncated")
    with pytest.raises(KernelStoreError, match="missing or changed since it was stored"):
        stored_kernel(store, RELEASE, "12.2.0")


def test_a_store_entry_without_an_image_is_refused(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    put(store, tmp_path, GCC12, "c12", [DEBS[0], "config"])
    with pytest.raises(KernelStoreError, match=r"holds no kernel image \.deb"):
        plan_install(RELEASE, "build", "12.2.0", store)


def test_a_packaged_kernel_comes_from_apt_with_its_headers():
    install = plan_install(RELEASE, "package", "12.2.0", None)
    assert install.packages == (f"proxmox-kernel-{RELEASE}", f"proxmox-headers-{RELEASE}")
    assert install.debs == ()


def test_an_installed_kernel_by_another_gcc_is_named():
    assert installed_problem(RELEASE, GCC12, "12.2.0") is None
    assert installed_problem(RELEASE, None, "12.2.0") is None
    problem = installed_problem(RELEASE, GCC13, "12.2.0")
    assert problem is not None and GCC13 in problem and "toolchain.gcc" in problem


def test_a_proxmox_packaged_build_installs_image_first(tmp_path):
    """What the pve-kernel packaging leaves (proxmox-kernel-*, proxmox-headers-*), made by the
    real dpkg-deb, installs like a linux-image build: the image package first."""
    store = ArtifactStore(tmp_path / "store")
    debs = [
        headers_deb(tmp_path, RELEASE, proxmox=True),
        kernel_deb(tmp_path, RELEASE, zfs=True, acs=True, proxmox=True),
    ]
    store.put(ArtifactKey("kernel", RELEASE, RELEASE, GCC12, "pve"), debs)
    install = plan_install(RELEASE, "build", "12.2.0", store)
    names = [d.rsplit("/", 1)[-1] for d in install.debs]
    assert names == [f"proxmox-kernel-{RELEASE}_{RELEASE}-1_amd64.deb", debs[0].name]
    features = package_features(install.debs[0], RELEASE)
    assert features.zfs and features.acs_override
