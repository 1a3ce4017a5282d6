"""NVIDIA's CUDA repository per guest distribution, and what Debian 13's apt (sqv) trusts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpuhost.guestsw.cudarepos import (
    binding_hashes,
    repo_in_url,
    repo_problems,
    sqv_refuses,
    supported_repo,
)
from gpuhost.guestsw.files import sources
from gpuhost.guestsw.model import SOURCES
from gpuhost.guestsw.plan import make_guest_plan
from gpuhost.observe.guestsoft import GPGV, SQV, SQV_POLICY, parse_guest, parse_os_release
from gpuhost.observe.parse import UnparsedOutput
from tests.unit.test_guestplan import CONTROL, facts, guest, problems

KEYS = Path(__file__).parents[1] / "fixtures" / "keys"
SHA1_KEY = (KEYS / "bound-by-sha1.asc").read_text()  # bound as NVIDIA's 3bf863cc is
SHA256_KEY = (KEYS / "bound-by-sha256.asc").read_text()
# /etc/os-release of Ubuntu 24.04.1 as a running system prints it (a kind node image's
# `cat /etc/os-release`, ssst0n3/docker_archive kubernetes/v1.32.3 README; base-files 13ubuntu10).
UBUNTU_2404 = """PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.1 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
"""
# Debian 13.8's /usr/lib/os-release (base-files), as in the twin's trixie base.
DEBIAN_13 = """PRETTY_NAME="Debian GNU/Linux 13 (trixie)"
NAME="Debian GNU/Linux"
VERSION_ID="13"
VERSION="13 (trixie)"
VERSION_CODENAME=trixie
DEBIAN_VERSION_FULL=13.8
ID=debian
HOME_URL="https://www.debian.org/"
SUPPORT_URL="https://www.debian.org/support"
BUG_REPORT_URL="https://bugs.debian.org/"
"""
NVIDIA = "https://mirror.test/compute/cuda/repos/{}/x86_64/"
UBUNTU = parse_os_release(UBUNTU_2404.splitlines())
TRIXIE = parse_os_release(DEBIAN_13.splitlines())


def test_os_release_names_nvidias_repository() -> None:
    assert UBUNTU is not None and (UBUNTU.id, UBUNTU.version_id) == ("ubuntu", "24.04")
    assert supported_repo(UBUNTU) == "ubuntu2404" and UBUNTU.pretty == "Ubuntu 24.04.1 LTS"
    assert TRIXIE is not None and supported_repo(TRIXIE) == "debian13"
    sid = parse_os_release(['PRETTY_NAME="Debian GNU/Linux trixie/sid"', "ID=debian"])
    assert (
        sid is not None and supported_repo(sid) is None
    )  # testing/sid: no VERSION_ID, no repository
    assert parse_os_release([]) is None
    assert parse_os_release(["ID=$(reboot)"]) is None  # not the grammar: ignored
    assert repo_in_url(NVIDIA.format("debian13")) == "debian13"
    assert repo_in_url("http://127.0.0.1:8080/") is None  # a mirror of another layout


def test_ubuntu_2404_gets_its_repository_both_toolkits_and_a_deb822_source() -> None:
    url = NVIDIA.format("ubuntu2404")
    g = guest(cuda_repo={"url": url, "keyring": "/k.pub"}, venvs=[])
    plan = make_guest_plan("ct200", g, {}, facts(os=UBUNTU), CONTROL)
    assert [t.version for t in plan.toolkits] == ["12.8", "13.0"]
    assert plan.notes == [
        "Ubuntu 24.04.1 LTS: NVIDIA's ubuntu2404 repository, apt verifies with gpgv"
    ]
    assert plan.files[SOURCES].content == sources(url, "/etc/apt/keyrings/gpuhost-cuda.asc")
    assert (
        "Types: deb\nURIs: " + url + "\nSuites: /\nSigned-By: /etc/apt/keyrings/gpuhost-cuda.asc\n"
        in (plan.files[SOURCES].content or "")
    )
    # Ubuntu 24.04's apt 2.7 verifies with gpgv: a SHA-1-bound key (NVIDIA's 3bf863cc) is fine
    control = replace(CONTROL, keyring=SHA1_KEY)
    assert make_guest_plan("ct200", g, {}, facts(os=UBUNTU, apt_verifier=GPGV), control)


def test_debian_13_is_refused_what_its_repository_does_not_publish_naming_field_and_fix() -> None:
    g = guest(cuda_repo={"url": NVIDIA.format("debian13"), "keyring": "/k.pub"}, venvs=[])
    assert problems(g, facts(os=TRIXIE)) == [
        "cuda: CUDA 12.8 is not published in NVIDIA's debian13 repository (it has 13.0, 13.1); "
        "remove '12.8' from cuda, or give this toolkit a guest whose release has it (Debian 12, "
        "Ubuntu 24.04)"
    ]
    wrong = guest(cuda=["13.0"], venvs=[])  # the fixture's URL is NVIDIA's debian12 layout
    (problem,) = problems(wrong, facts(os=TRIXIE))
    assert problem.startswith("cuda_repo.url https://repo.test/cuda/debian12/x86_64/ is NVIDIA's")
    assert "use .../compute/cuda/repos/debian13/x86_64/" in problem
    mirror = guest(cuda_repo={"url": "http://10.0.0.5/cuda/", "keyring": "/k.pub"}, venvs=[])
    assert "CUDA 12.8 is not published" in problems(mirror, facts(os=TRIXIE))[0]


def test_sqv_refuses_a_key_bound_by_sha1_only_and_the_plan_says_so_first() -> None:
    assert binding_hashes(SHA1_KEY) == ["SHA-1"] and binding_hashes(SHA256_KEY) == ["SHA-256"]
    assert sqv_refuses(SHA1_KEY) == "its self-signatures use SHA-1 only"
    assert sqv_refuses(SHA256_KEY) is None
    with pytest.raises(ValueError):
        binding_hashes(
            "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ\n-----END PGP PUBLIC KEY BLOCK-----"
        )
    url = NVIDIA.format("debian13")
    args = (TRIXIE, SQV, url, "/keys/3bf863cc.pub", SHA1_KEY, ["13.0"])
    (problem,) = repo_problems(*args)
    assert problem.startswith("cuda_repo.keyring /keys/3bf863cc.pub: the guest's apt verifies")
    assert "SHA-1 only" in problem and "debian13: the new key, not 3bf863cc" in problem
    assert repo_problems(TRIXIE, SQV, url, "/k", SHA256_KEY, ["13.0"]) == []
    # an operator's own Sequoia policy decides for itself; apt before 2.9.19 uses gpgv
    assert repo_problems(TRIXIE, SQV_POLICY, url, "/k", SHA1_KEY, ["13.0"]) == []
    assert repo_problems(TRIXIE, GPGV, url, "/k", SHA1_KEY, ["13.0"]) == []


def test_unsupported_or_unknown_guests_are_refused_by_name() -> None:
    alpine = parse_os_release(
        ["ID=alpine", "VERSION_ID=3.20.3", 'PRETTY_NAME="Alpine Linux v3.20"']
    )
    (problem,) = repo_problems(alpine, GPGV, NVIDIA.format("debian12"), "/k", None, ["12.8"])
    assert "runs Alpine Linux v3.20 (ID=alpine VERSION_ID=3.20.3)" in problem
    assert "debian 12, debian 13, ubuntu 22.04, ubuntu 24.04" in problem
    assert "no /etc/os-release" in repo_problems(None, GPGV, "http://x/", "/k", None, ["12.8"])[0]


def test_the_guest_fact_reads_os_release_and_the_verifier() -> None:
    raw = {
        "driver": (0, []),
        "system": (0, ["x86_64", "8", "1024", "max"]),
        "files": (0, []),
        "toolkits": (0, []),
        "alternatives": (0, []),
        "uv": (0, []),
        "cuda_versions": (0, []),
        "os": (0, DEBIAN_13.splitlines()),
        "apt_verifier": (0, ["sqv"]),
    }
    found = parse_guest(raw)
    assert found.os == TRIXIE and found.apt_verifier == SQV
    with pytest.raises(UnparsedOutput):
        parse_guest({**raw, "apt_verifier": (0, ["gnupg"])})
