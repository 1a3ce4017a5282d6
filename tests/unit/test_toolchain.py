"""The one-toolchain rule and the compiler fact, on real compiler strings (Debian 12, Proxmox
kernels, the H200 capture's gcc 15.3.0 kernel and its Ubuntu compilers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.observe.compilers import KernelCompilers, parse_compilers
from gpuhost.plan.driver.toolchain import (
    GIB,
    Compiler,
    ToolchainError,
    build_jobs,
    choose_module_compiler,
    parse_compiler,
)

CAPTURE = Path(__file__).parents[1] / "fixtures/captures/h200x1-boot-raw"
DEBIAN = {
    "gcc": "gcc (Debian 12.2.0-14+deb12u1) 12.2.0",
    "cc": "cc (Debian 12.2.0-14+deb12u1) 12.2.0",
    "gcc-11": "gcc-11 (Debian 11.3.0-12) 11.3.0",
    "gcc-12": "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0",
}


@pytest.mark.parametrize(
    "text,expected",
    [
        ('"gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"', Compiler("gcc", "12.2.0")),
        ("gcc (Debian 12.2.0-14+deb12u1) 12.2.0", Compiler("gcc", "12.2.0")),
        ("gcc (GCC) 15.3.0", Compiler("gcc", "15.3.0")),
        ("GCC: (Debian 12.2.0-14+deb12u1) 12.2.0", Compiler("gcc", "12.2.0")),
        (
            "x86_64-linux-gnu-gcc-13 (Ubuntu 13.3.0-6ubuntu2~24.04.1) 13.3.0",
            Compiler("gcc", "13.3.0"),
        ),
        ("gcc version 15.3.0 (GCC) ", Compiler("gcc", "15.3.0")),
        ("Debian clang version 14.0.6", None),
        ("", None),
    ],
)
def test_parse_compiler(text: str, expected: Compiler | None) -> None:
    if expected is None:
        with pytest.raises(ToolchainError, match="compiler"):
            parse_compiler(text)
    else:
        assert parse_compiler(text) == expected


def test_the_kernels_version_is_chosen_under_its_versioned_name() -> None:
    choice = choose_module_compiler("gcc (Debian 12.2.0-14+deb12u1) 12.2.0", DEBIAN)
    assert choice.command == "gcc-12" and choice.refusal is None
    assert choice.compiler_text == DEBIAN["gcc-12"]


def test_another_compiler_is_refused_naming_both() -> None:
    kernel = "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"
    only_11 = {"gcc-11": DEBIAN["gcc-11"]}
    choice = choose_module_compiler(kernel, only_11)
    assert choice.command is None and choice.refusal is not None
    assert kernel in choice.refusal and DEBIAN["gcc-11"] in choice.refusal
    assert "Install gcc-12 12.2.0" in choice.refusal
    assert choose_module_compiler(kernel, {}).refusal.endswith("or build on a machine that has it")


def test_the_h200_capture_has_no_compiler_for_its_kernel() -> None:
    """The real capture: a gcc 15.3.0 kernel, Ubuntu gcc 12.4 and 13.3 on the host."""
    lines = (CAPTURE / "compilers.out").read_text().splitlines()
    available = {}
    for i, line in enumerate(lines):
        if line.startswith("== "):
            available[line.split()[1]] = lines[i + 1]
    choice = choose_module_compiler('"gcc (GCC) 15.3.0"', available)
    assert choice.command is None
    assert "gcc (GCC) 15.3.0" in choice.refusal and "gcc-13 (Ubuntu 13.3.0" in choice.refusal


@pytest.mark.parametrize(
    "cores,available,kind,jobs",
    [
        (16, 125 * GIB, "c", 16),  # the H200: cores bound
        (128, 64 * GIB, "nvcc", 15),  # (64-2)//4: memory bound, not 128
        (128, 90 * GIB, "nvcc", 22),
        (8, 1 * GIB, "c", 1),  # less than the reserve: still one job
        (2, 3 * GIB + 5, "c", 1),
    ],
)
def test_build_jobs(cores: int, available: int, kind: str, jobs: int) -> None:
    assert build_jobs(cores, available, kind) == jobs


def test_build_jobs_refuses_an_unknown_kind() -> None:
    with pytest.raises(ToolchainError, match="unknown build kind 'rust'"):
        build_jobs(4, 8 * GIB, "rust")


PROXMOX_OUTPUT = """\
== kernel 6.8.12-9-pve boot
CONFIG_CC_VERSION_TEXT="gcc (Debian 12.2.0-14+deb12u1) 12.2.0"
== kernel 6.14.8-2-bpo12-pve boot
CONFIG_CC_VERSION_TEXT=gcc (Debian 12.2.0-14) 12.2.0
== kernel 6.14.8-2-bpo12-pve build
CONFIG_CC_VERSION_TEXT="gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0"
== kernel 6.2.16-3-pve boot
== kernel 6.18.44-fc-v973-gpu proc
CONFIG_CC_VERSION_TEXT="gcc (GCC) 15.3.0"
== compiler gcc /usr/bin/gcc
gcc (Debian 12.2.0-14+deb12u1) 12.2.0
== compiler gcc-12 /usr/bin/gcc-12
gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0
"""


def test_the_fact_parses_kernels_and_compilers() -> None:
    found = parse_compilers(PROXMOX_OUTPUT.splitlines())
    assert found.kernels["6.14.8-2-bpo12-pve"] == {
        "boot": "gcc (Debian 12.2.0-14) 12.2.0",  # unquoted
        "build": "gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0",
    }
    assert found.kernel_compiler("6.14.8-2-bpo12-pve") == "gcc (Debian 12.2.0-14) 12.2.0"
    assert found.kernel_compiler("6.2.16-3-pve") is None  # a config without the line
    assert found.kernel_compiler("6.18.44-fc-v973-gpu") == "gcc (GCC) 15.3.0"
    assert found.kernel_compiler("6.9.9-1-pve") is None
    assert found.compilers == {"gcc": DEBIAN["gcc"], "gcc-12": DEBIAN["gcc-12"]}


def test_the_fact_is_empty_where_nothing_is_installed() -> None:
    assert parse_compilers([]) == KernelCompilers.default()
    assert parse_compilers(["== compiler gcc /usr/bin/gcc"]).compilers == {"gcc": ""}


@pytest.mark.parametrize(
    "line,why",
    [
        ("CONFIG_CC_VERSION_TEXT=x", "before any section"),
        ("== kernel 6.8.12-9-pve boot\nCONFIG_GCC_VERSION=120200", "not a CONFIG_CC_VERSION_TEXT"),
        ("== compiler cc /usr/bin/cc\ncc (x) 1.2.3\nmore", "second line"),
    ],
)
def test_the_fact_names_what_it_does_not_understand(line: str, why: str) -> None:
    with pytest.raises(Exception, match=why):
        parse_compilers(line.splitlines())


def test_the_command_runs_on_this_machine() -> None:
    import subprocess

    done = subprocess.run(
        ["sh", "-c", KernelCompilers().command()], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
    found = parse_compilers(done.stdout.splitlines())
    assert all(line for line in found.compilers.values())
