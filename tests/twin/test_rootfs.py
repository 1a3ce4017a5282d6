"""The base rootfs: mirror discovery (pure) and the built base's contents (needs root)."""

import re
import subprocess
from pathlib import Path

import pytest

from twin import rootfs

DEB822 = """Types: deb
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main
"""


def _etc_apt(tmp_path: Path, sources: str = "", listing: str = "") -> Path:
    (tmp_path / "sources.list.d").mkdir()
    if sources:
        (tmp_path / "sources.list.d" / "debian.sources").write_text(sources)
    if listing:
        (tmp_path / "sources.list").write_text(listing)
    return tmp_path


def test_mirror_from_deb822_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUHOST_TWIN_MIRROR", raising=False)
    mirror = rootfs.find_mirror(_etc_apt(tmp_path, sources=DEB822))
    assert mirror.uri == "http://mirror.invalid/debian"
    assert mirror.keyring == "/usr/share/keyrings/debian-archive-keyring.gpg"


def test_mirror_from_one_line_sources_list(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUHOST_TWIN_MIRROR", raising=False)
    listing = (
        "# comment\ndeb [signed-by=/k.gpg] http://mirror.invalid/debian/ bookworm main contrib\n"
    )
    mirror = rootfs.find_mirror(_etc_apt(tmp_path, listing=listing))
    assert mirror == rootfs.Mirror("http://mirror.invalid/debian", "/k.gpg")


def test_mirror_override_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHOST_TWIN_MIRROR", "http://other.invalid/debian/")
    assert (
        rootfs.find_mirror(_etc_apt(tmp_path, sources=DEB822)).uri == "http://other.invalid/debian"
    )


def test_no_mirror_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUHOST_TWIN_MIRROR", raising=False)
    with pytest.raises(rootfs.RootfsError, match="GPUHOST_TWIN_MIRROR"):
        rootfs.find_mirror(_etc_apt(tmp_path, listing="deb http://x.invalid/ubuntu noble main\n"))


def test_trixie_from_the_archive_that_serves_bookworm(tmp_path, monkeypatch):
    """A Debian 12 machine (CI) builds the Debian 13 base from the same Debian archive."""
    monkeypatch.delenv("GPUHOST_TWIN_MIRROR", raising=False)
    etc_apt = _etc_apt(tmp_path, sources=DEB822)
    assert rootfs.find_mirror(etc_apt, suite="trixie") == rootfs.find_mirror(etc_apt)


def test_another_vendors_suite_is_no_debian_mirror(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUHOST_TWIN_MIRROR", raising=False)
    listing = "deb [signed-by=/usr/share/keyrings/vendor.gpg] http://x.invalid/v bookworm main\n"
    with pytest.raises(rootfs.RootfsError, match="'trixie'"):
        rootfs.find_mirror(_etc_apt(tmp_path, listing=listing), suite="trixie")


def test_each_suite_has_its_own_base() -> None:
    assert rootfs.base_path("bookworm") != rootfs.base_path("trixie")
    assert rootfs.current_bases() == {rootfs.base_path("bookworm"), rootfs.base_path("trixie")}
    assert "gcc-14" in rootfs.SUITES["trixie"] and "gcc-12" not in rootfs.SUITES["trixie"]
    with pytest.raises(rootfs.RootfsError, match="known: \\['bookworm', 'trixie'\\]"):
        rootfs.base_path("sid")


def test_recipe_hash_follows_the_package_list(monkeypatch):
    before = rootfs.recipe_hash()
    assert rootfs.recipe_hash() == before  # stable: the cache is found again
    trixie = rootfs.recipe_hash("trixie")
    monkeypatch.setitem(rootfs.SUITES, "bookworm", (*rootfs.PACKAGES, "gcc-11"))
    assert rootfs.recipe_hash() != before
    assert rootfs.recipe_hash("trixie") == trixie  # each suite's cache stands alone


def test_chroot_safety_refuses_writable_components(tmp_path):
    unsafe = tmp_path / "x"
    unsafe.mkdir()
    unsafe.chmod(0o777)
    with pytest.raises(rootfs.RootfsError, match="ChrootDirectory"):
        rootfs.check_chroot_safe(unsafe)


@pytest.mark.parametrize(
    ("suite", "gcc", "extra"),
    [("bookworm", "12.2.0", ()), ("trixie", "14.2.0", ("usr/sbin/mkinitramfs",))],
)
def test_base_holds_toolchain_and_real_headers(twin_base, trixie_base, suite, gcc, extra):
    base = twin_base if suite == rootfs.SUITE else trixie_base
    rootfs.check_chroot_safe(base)
    release = rootfs.headers_version(base)
    assert release.endswith("-amd64")
    config = (base / "usr/src" / f"linux-headers-{release}" / ".config").read_text()
    major = gcc.split(".")[0]
    assert re.search(rf'CONFIG_CC_VERSION_TEXT="\S*gcc-{major} \(Debian {gcc}', config)
    assert f"VERSION_CODENAME={suite}" in (base / "etc/os-release").read_text()
    for tool in (
        f"usr/bin/gcc-{major}",
        *extra,
        "usr/bin/make",
        "usr/bin/python3",
        "usr/bin/kmod",
        "usr/bin/apt-get",
    ):
        assert (base / tool).exists(), tool
    assert "root:x:0:0:root:/root:/bin/bash" in (base / "etc/passwd").read_text()
    assert not list((base / "etc/ssh").glob("ssh_host_*")), (
        "host keys must not be shared via the base"
    )


# debootstrap's own messages, in the order and shape of a real bookworm build (its build.log)
DEBOOTSTRAP = """I: Retrieving InRelease
I: Checking Release signature
I: Retrieving Packages
I: Validating Packages
I: Resolving dependencies of required packages...
I: Retrieving apt 2.6.1
I: Validating apt 2.6.1
I: Retrieving base-files 12.4+deb12u11
I: Validating base-files 12.4+deb12u11
I: Extracting apt...
I: Extracting base-files...
I: Installing core packages...
I: Unpacking required packages...
I: Unpacking base-files...
I: Configuring required packages...
I: Configuring base-files...
I: Unpacking the base system...
I: Unpacking gcc-12...
I: Configuring the base system...
I: Configuring gcc-12...
I: Base system installed successfully.
"""


def test_the_base_build_says_each_stage_of_debootstrap_as_it_starts(tmp_path: Path) -> None:
    said: list[str] = []
    with open(tmp_path / "build.log", "w") as log:
        rootfs._debootstrap(["printf", "%s", DEBOOTSTRAP], log, said.append, 0.0)
    stages = [re.sub(r" \(\d+ s\)$", "", line) for line in said]
    assert stages == [
        "  downloading packages",
        "  extracting packages",
        "  unpacking packages",
        "  configuring packages",
        "  unpacking packages",
        "  configuring packages",
    ]
    assert (tmp_path / "build.log").read_text() == DEBOOTSTRAP  # the whole output, for errors


def test_a_failed_debootstrap_is_an_error(tmp_path: Path) -> None:
    with open(tmp_path / "build.log", "w") as log, pytest.raises(subprocess.CalledProcessError):
        rootfs._debootstrap(["sh", "-c", "echo 'E: no mirror'; exit 1"], log, print, 0.0)
