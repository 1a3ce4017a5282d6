"""A host upgraded from Proxmox VE 8 to 9, as its facts show it: the plan names the change and
refuses a spec still of the previous release, naming the fields and the fix."""

import pytest

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.release import HostRelease, parse_release
from gpuhost.plan.make import make_plan
from gpuhost.plan.model import PlanError
from gpuhost.spec.host import HostSpec
from tests.unit.hosts import kpro6

# What the upgraded kpro6 twin's fact commands print (os-release, dpkg-query, the configs).
RELEASE_9 = ["os ID=debian", 'os VERSION_ID="13"', "os VERSION_CODENAME=trixie",
             "pve-manager ii  9.0.10"]  # fmt: skip
RELEASE_8 = ["os ID=debian", 'os VERSION_ID="12"', "os VERSION_CODENAME=bookworm",
             "pve-manager ii  8.4.1"]  # fmt: skip
UPGRADED = [
    "== kernel 6.8.12-9-pve boot",
    'CONFIG_CC_VERSION_TEXT="gcc (Debian 12.2.0-14) 12.2.0"',
    "== kernel 6.14.8-2-pve boot",
    'CONFIG_CC_VERSION_TEXT="gcc (Debian 14.2.0-19) 14.2.0"',
    "== kernel 6.12.117+deb13-amd64 build",  # Debian's headers alone: no kernel
    'CONFIG_CC_VERSION_TEXT="x86_64-linux-gnu-gcc-14 (Debian 14.2.0-19) 14.2.0"',
    "== compiler gcc-14 /usr/bin/gcc-14",
    "gcc-14 (Debian 14.2.0-19) 14.2.0",
]
BEFORE = [*UPGRADED[:2], "== compiler gcc-12 /usr/bin/gcc-12", "gcc-12 (Debian 12.2.0-14) 12.2.0"]
PVE8_SPEC = {"kernel": {"version": "6.8.12-9-pve"}, "toolchain": {"gcc": "12.2.0"},
             "driver": {"version": "580.95.05"}}  # fmt: skip
PVE9_SPEC = {**PVE8_SPEC, "kernel": {"version": "6.14.8-2-pve"}, "toolchain": {"gcc": "14.2.0"}}


def facts(release: list[str], compilers: list[str]) -> HostFacts:
    return kpro6(HostRelease=(0, release), KernelCompilers=(0, compilers))


def test_the_release_fact_reads_os_release_and_pve_manager() -> None:
    release = parse_release(RELEASE_9)
    assert release == HostRelease("debian", "13", "trixie", "9.0.10")
    assert release.pve_major == 9
    assert release.describe() == "Proxmox VE 9.0.10 on Debian 13 (trixie)"
    assert parse_release(["os ID=debian"]).pve_major is None  # no pve-manager: not Proxmox
    with pytest.raises(UnparsedOutput):
        parse_release(["os PRETTY_NAME=x"])


def test_the_release_fact_reads_qemu_server_and_a_package_known_but_not_installed() -> None:
    # dpkg-query's `${Package} ${db:Status-Abbrev} ${Version}`: the abbreviation is three
    # characters ("ii ", "un "), a package not installed has no version
    lines = ["os ID=debian", "pve-manager ii  9.0.10", "qemu-server ii  9.0.21"]
    release = parse_release(lines)
    assert (release.pve_manager, release.qemu_server) == ("9.0.10", "9.0.21")
    release = parse_release(["os ID=debian", "pve-manager un  ", "qemu-server rc  8.3.8"])
    assert (release.pve_manager, release.qemu_server) == (None, None)
    with pytest.raises(UnparsedOutput):
        parse_release(["qemu-server ii  9.0.21 extra"])


def test_a_pve8_spec_on_an_upgraded_host_is_refused_naming_the_fields_and_the_fix() -> None:
    with pytest.raises(PlanError) as info:
        make_plan("kpro6", HostSpec.model_validate(PVE8_SPEC), facts(RELEASE_9, UPGRADED))
    kernel, gcc = info.value.problems
    assert kernel.startswith("kernel.version 6.8.12-9-pve is a kernel of the release before")
    assert "Proxmox VE 9.0.10 on Debian 13 (trixie); compilers: gcc-14 14.2.0" in kernel
    assert "set kernel.version: 6.14.8-2-pve (installed, built by gcc 14.2.0)" in kernel
    assert gcc.startswith("toolchain.gcc 12.2.0 is the compiler of the release before")
    assert "toolchain.gcc: 14.2.0" in gcc


def test_the_plan_of_an_upgraded_host_says_what_the_upgrade_changed() -> None:
    plan = make_plan("kpro6", HostSpec.model_validate(PVE9_SPEC), facts(RELEASE_9, UPGRADED))
    change = plan.release_change
    assert change is not None
    assert change.previous == {"6.8.12-9-pve": "12.2.0"}
    assert change.current == {"6.14.8-2-pve": "14.2.0"}  # not the headers-only 6.12
    assert change.running == "6.8.12-9-pve"
    notes = "\n".join(plan.notes)
    assert "kernels of the new series: 6.14.8-2-pve (gcc 14.2.0)" in notes
    assert "the running kernel 6.8.12-9-pve is from before the upgrade" in notes
    assert "modules must be built for 6.14.8-2-pve with gcc 14.2.0" in notes


def test_a_pve8_host_and_a_pve9_host_without_old_kernels_have_no_release_change() -> None:
    pve8 = make_plan("kpro6", HostSpec.model_validate(PVE8_SPEC), facts(RELEASE_8, BEFORE))
    assert pve8.release_change is None
    fresh9 = facts(RELEASE_9, UPGRADED[2:])  # installed as 9: no kernel of an older compiler
    assert make_plan("kpro6", HostSpec.model_validate(PVE9_SPEC), fresh9).release_change is None
    unknown = kpro6()  # a snapshot without the release fact
    assert make_plan("kpro6", HostSpec.model_validate(PVE8_SPEC), unknown).release_change is None
