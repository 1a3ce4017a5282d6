"""Reading a .deb's control fields on the control machine (gpuhost/build/debinfo.py), on real
packages built by dpkg-deb (the twin's fabric manager stand-in, twin/fabricmanager.py)."""

import shutil

import pytest

from gpuhost.build.debinfo import DebError, control_fields
from twin.fabricmanager import build_fabricmanager, deb_name

pytestmark = pytest.mark.skipif(not shutil.which("dpkg-deb"), reason="needs dpkg-deb")


@pytest.mark.parametrize(
    ("version", "package"),
    [("595.71.05", "nvidia-fabricmanager"), ("570.124.06", "nvidia-fabricmanager-570")],
)
def test_the_package_says_what_it_is(tmp_path, version, package):
    deb = build_fabricmanager(version, tmp_path)
    assert deb.name == f"{package}_{version}-1_amd64.deb" == deb_name(version)
    fields = control_fields(deb)
    assert (fields["Package"], fields["Version"], fields["Architecture"]) == (
        package,
        f"{version}-1",
        "amd64",
    )


def test_a_file_name_that_lies_is_seen_through(tmp_path):
    liar = build_fabricmanager("595.71.04", tmp_path, name=deb_name("595.71.05"))
    assert control_fields(liar)["Version"] == "595.71.04-1"


def test_something_else_is_refused_naming_the_file(tmp_path):
    fake = tmp_path / "nvidia-fabricmanager_595.71.05-1_amd64.deb"
    fake.write_text("#!/bin/sh\n")
    with pytest.raises(DebError, match="not a Debian package"):
        control_fields(fake)
