"""The NVIDIA module build and the artifact store, for real: Kbuild against the machine's Debian
kernel headers with gcc-12 (the compiler that built them), on the stand-in source tree
(tests/fixtures/driver-src), then stored and read back verified."""

from __future__ import annotations

import pytest

from gpuhost.build.artifacts import ArtifactError, ArtifactKey, ArtifactStore
from gpuhost.build.driver import MODULES, build_command, source_version
from tests.unit.buildtools import DRIVER_TREE as TREE


def test_source_version_and_the_build_command():
    assert source_version(TREE) == "595.71.05"
    assert build_command("/tmp/nv src", "/lib/modules/6.14.8-2-bpo12-pve/build", "gcc-12", 8) == (
        "make -C '/tmp/nv src' modules SYSSRC=/lib/modules/6.14.8-2-bpo12-pve/build CC=gcc-12 -j8"
    )


def test_a_real_build_carries_kernel_version_and_compiler(driver_built):
    headers, modules = driver_built  # tests/unit/conftest.py
    kernel = headers.name.removeprefix("linux-headers-")
    assert [m.path.name for m in modules] == [f"{m}.ko" for m in MODULES]
    for module in modules:
        assert module.kernel == kernel
        assert module.vermagic.startswith(f"{kernel} SMP")
        assert module.version == "595.71.05"
        assert module.compiler.startswith("GCC: (Debian 12.2.0")
    assert not (TREE / "kernel-open/nvidia.ko").exists()  # built in a copy


def test_the_store_keeps_them_verified(driver_built, tmp_path):
    _, modules = driver_built  # tests/unit/conftest.py
    store = ArtifactStore(tmp_path / "store")
    key = ArtifactKey(
        "nvidia-modules", "595.71.05", modules[0].kernel, "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"
    )
    assert store.get(key) is None
    stored = store.put(key, [m.path for m in modules], {"vermagic": modules[0].vermagic})
    again = store.get(key)
    assert again is not None and again.files == stored.files
    assert sorted(again.files) == sorted(f"{m}.ko" for m in MODULES)
    other = ArtifactKey(
        "nvidia-modules", "595.71.05", modules[0].kernel, "gcc-11 (Debian 11.3.0-12) 11.3.0"
    )
    assert store.get(other) is None  # another compiler is another artifact
    with again.file("nvidia.ko").open("r+b") as f:
        f.seek(100)
        f.write(b"\0")
    with pytest.raises(ArtifactError, match="missing or changed since it was stored"):
        store.get(key)


def test_keys_name_everything_the_bytes_depend_on():
    key = ArtifactKey(
        "kernel",
        "6.14.8-2-bpo12-pve",
        "6.14.8-2-bpo12-pve",
        "gcc (Debian 12.2.0-14) 12.2.0",
        "c0ffee",
    )
    parts = key.path.parts
    assert parts[:3] == ("kernel", "6.14.8-2-bpo12-pve", "6.14.8-2-bpo12-pve")
    assert parts[3].startswith("gcc_Debian_12.2.0-14_12.2.0-") and parts[4] == "c0ffee"
    assert "/" not in parts[3] and " " not in parts[3]
