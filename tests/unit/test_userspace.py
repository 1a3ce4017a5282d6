"""The NVIDIA userspace: the spec's installer and fabric manager fields, the plan's pieces
(persistenced unit, NVSwitch boards), the fact on real captured output, the operation's
commands, and the twin's stand-in installer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError
from pyinfra.context import ctx_host, ctx_state

from deploys import context, userspace
from facts.driver_install import DriverUserspace
from gpuhost.observe.driver_install import parse_userspace_state
from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.snapshot import split_combined
from gpuhost.plan.driver.userspace import PERSISTENCED_UNIT, PERSISTENCED_WANTS
from gpuhost.plan.make import make_plan
from gpuhost.plan.model import PlanError
from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import describe
from tests.unit.hosts import kpro6, kpro6_raw, pci_lines
from tests.unit.test_operations import FakeHost

CAPTURE = Path(__file__).parents[1] / "fixtures/captures/h200x1-audit-run/audit-host.out"
VERSION = "595.71.05"
RUN = f"/srv/nvidia/NVIDIA-Linux-x86_64-{VERSION}.run"
FABRIC = f"/srv/nvidia/nvidia-fabricmanager-595_{VERSION}-1_amd64.deb"


def spec(**source: str) -> dict:
    return {
        "kernel": {"version": "6.8.12-9-pve"},
        "driver": {"version": VERSION, "source": {"tree": "/t", "store": "/s", **source}},
    }


def problems(data: dict) -> list[str]:
    with pytest.raises(ValidationError) as exc:
        HostSpec.model_validate(data)
    return describe(exc.value)


@pytest.mark.parametrize(
    "source",
    [
        {"installer": RUN},
        {"installer": RUN, "fabricmanager": FABRIC},
        {"installer": RUN, "fabricmanager": f"/srv/nvidia-fabricmanager_{VERSION}-1_amd64.deb"},
    ],
)
def test_good_installer_and_fabricmanager(source: dict) -> None:
    got = HostSpec.model_validate(spec(**source)).driver.source
    assert got is not None and got.installer == RUN


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            {"installer": "/srv/NVIDIA-Linux-x86_64-595.71.04.run"},
            "driver.source.installer = '/srv/NVIDIA-Linux-x86_64-595.71.04.run': it installs "
            "driver 595.71.04, but driver.version is 595.71.05; point it at "
            "NVIDIA-Linux-x86_64-595.71.05.run",
        ),
        ({"installer": "/srv/nvidia.run"}, "'nvidia.run' is not an NVIDIA installer's name"),
        ({"installer": "srv/x.run"}, "is not an absolute, normalised path"),
        ({"installer": "/srv/../NVIDIA-Linux-x86_64-595.71.05.run"}, "normalised"),
        (
            {"installer": "/srv/NVIDIA-Linux-x86_64-595.71.05.run; reboot"},
            "driver.source.installer",
        ),
        ({"installer": True}, "driver.source.installer = True"),
        (
            {"fabricmanager": "/srv/nvidia-fabricmanager-580_580.105.08-1_amd64.deb"},
            "driver.source.fabricmanager = '/srv/nvidia-fabricmanager-580_580.105.08-1_amd64.deb'"
            ": it is fabric manager 580.105.08, but driver.version is 595.71.05",
        ),
        (
            {"fabricmanager": f"/srv/nvidia-fabricmanager-580_{VERSION}-1_amd64.deb"},
            "driver.source.fabricmanager",
        ),
        ({"fabricmanager": "/srv/fabricmanager.tar.xz"}, "is not a fabric manager package"),
        ({"installr": RUN}, "did you mean driver.source.installer?"),
    ],
)
def test_bad_installer_and_fabricmanager(source: dict, message: str) -> None:
    found = problems(spec(**source))
    assert any(message in p for p in found), found


def test_without_an_installer_nothing_of_the_userspace_is_planned() -> None:
    plan = make_plan("kpro6", HostSpec.model_validate(spec()), kpro6())
    assert plan.driver_userspace is None
    assert not plan.files[PERSISTENCED_UNIT].present
    assert not plan.files[PERSISTENCED_WANTS].present


def test_the_plan_has_the_installer_and_an_enabled_persistenced_unit() -> None:
    plan = make_plan("kpro6", HostSpec.model_validate(spec(installer=RUN)), kpro6())
    wanted = plan.driver_userspace
    assert wanted is not None
    assert (wanted.version, wanted.installer, wanted.fabricmanager) == (VERSION, RUN, None)
    assert wanted.remote_installer == f"/var/lib/gpuhost/driver-installer/{RUN.rsplit('/')[-1]}"
    unit = plan.files[PERSISTENCED_UNIT]
    assert unit.concern == "userspace" and unit.content is not None
    assert "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced\n" in unit.content
    assert "Type=forking\n" in unit.content
    assert plan.files[PERSISTENCED_WANTS].link == PERSISTENCED_UNIT
    systemd = next(f for f in plan.follow_ups if f.name == "systemd")
    assert PERSISTENCED_UNIT in systemd.triggers


def with_nvswitch() -> dict:
    raw = kpro6_raw()
    status, lines = raw["PciDevices"]
    switch = pci_lines(
        "0000:05:00.0",
        "pci0000:00/0000:05:00.0",
        "10de",
        "22a3",
        "068000",
        0,
        "nvidia-nvswitch",
        90,
    )
    return {"PciDevices": (status, lines + switch)}


def test_nvswitch_boards_need_the_fabric_manager_package() -> None:
    facts = kpro6(**with_nvswitch())
    with pytest.raises(PlanError) as exc:
        make_plan("kpro6", HostSpec.model_validate(spec(installer=RUN)), facts)
    assert (
        "driver.source.fabricmanager: required on this host, which has NVSwitches "
        "(0000:05:00.0)" in str(exc.value)
    )
    plan = make_plan(
        "kpro6", HostSpec.model_validate(spec(installer=RUN, fabricmanager=FABRIC)), facts
    )
    assert plan.driver_userspace.fabricmanager == FABRIC
    assert plan.driver_userspace.nvswitches == ("0000:05:00.0",)
    # Without NVSwitches the package is not installed, even when given.
    plan = make_plan(
        "kpro6", HostSpec.model_validate(spec(installer=RUN, fabricmanager=FABRIC)), kpro6()
    )
    assert plan.driver_userspace.fabricmanager is None


def captured_state() -> list[str]:
    """The real H200's answers to the three facts DriverUserspace joins, in its sections."""
    raw = split_combined(CAPTURE.read_text().splitlines())
    return [
        "#section=userspace",
        *raw["NvidiaUserspace"][1],
        "#section=firmware",
        *raw["GspFirmwareFiles"][1],
        "#section=persistenced",
        "binary=yes",
        "#section=fabric",
        *raw["NvidiaFabricManager"][1],
    ]


def test_the_fact_on_a_real_h200() -> None:
    state = parse_userspace_state(captured_state())
    assert state.libraries == {"libcuda": ["580.159.04"], "libnvidia-ml": ["580.159.04"]}
    assert state.firmware == {}  # the captured VM has no firmware on disk
    assert state.persistenced and not state.persistenced_user
    assert state.fabric.version is None
    assert not state.installed("580.159.04")  # no GSP firmware: not a complete install
    with_firmware = [
        *captured_state(),
        "#section=firmware",
        "/lib/firmware/nvidia/580.159.04/gsp_ga10x.bin",
    ]
    assert parse_userspace_state(with_firmware).installed("580.159.04")
    assert not parse_userspace_state(with_firmware).installed(VERSION)


def test_the_fact_refuses_what_it_does_not_know() -> None:
    with pytest.raises(UnparsedOutput):
        parse_userspace_state(["/usr/lib/libcuda.so.1"])
    with pytest.raises(UnparsedOutput):
        parse_userspace_state(["#section=userspace"])


def test_the_fact_command_runs_here() -> None:
    out = subprocess.run(
        ["sh", "-c", DriverUserspace().command()], capture_output=True, text=True, check=True
    ).stdout
    parse_userspace_state(out.splitlines())


class UserspaceHost(FakeHost):
    """A host whose DriverUserspace fact answers ``lines`` (the batched fact as FakeHost's)."""

    def __init__(self, files: dict, lines: list[str]) -> None:
        super().__init__(files)
        self.lines = lines

    def get_fact(self, cls, **kwargs):
        if cls is DriverUserspace:
            return parse_userspace_state(self.lines)
        return super().get_fact(cls, **kwargs)


def state(version: str, user: bool = True) -> list[str]:
    lib = "/usr/lib/x86_64-linux-gnu"
    return [
        "#section=userspace",
        f"{lib}/libcuda.so.{version}",
        f"{lib}/libnvidia-ml.so.{version}",
        "#section=firmware",
        f"/lib/firmware/nvidia/{version}/gsp_ga10x.bin",
        "#section=persistenced",
        "binary=yes",
        *(["user=yes"] if user else []),
        "#section=fabric",
        "package=",
        "active=",
    ]


def commands(host: UserspaceHost) -> list[str]:
    wanted = make_plan("kpro6", HostSpec.model_validate(spec(installer=RUN)), kpro6())
    context._observed.clear()
    with ctx_host.use(host), ctx_state.use(host.state):
        out = [
            c if isinstance(c, str) else f"upload {c.src} {c.dest}"
            for c in userspace.userspace_installed._inner(wanted=wanted.driver_userspace)
        ]
    context._observed.clear()
    return out


def test_the_installed_version_is_left_alone() -> None:
    host = UserspaceHost({}, state(VERSION))
    assert commands(host) == []
    assert host.noops == [f"NVIDIA {VERSION} userspace and GSP firmware are installed"]


@pytest.mark.parametrize(
    ("files", "lines"),
    [
        ({}, state("580.159.04")),  # another version
        ({"/var/lib/gpuhost/pending-userspace": ""}, state(VERSION)),  # a run killed midway
    ],
)
def test_otherwise_the_installer_runs_without_kernel_modules_and_is_checked(files, lines) -> None:
    host = UserspaceHost(files, lines)
    remote = f"/var/lib/gpuhost/driver-installer/NVIDIA-Linux-x86_64-{VERSION}.run"
    mark, upload, install = commands(host)
    assert mark.endswith("touch /var/lib/gpuhost/pending-userspace")
    assert upload == f"upload {RUN} {remote}"
    assert install.startswith(
        f"sh {remote} --silent --no-kernel-modules --no-kernel-module-source --no-nouveau-check --accept-license && "
    )
    assert f"wanted driver {VERSION}" in install
    assert install.endswith(f"rm -f {remote} /var/lib/gpuhost/pending-userspace")
    assert host.noops == []


def test_the_daemons_user_is_made_when_missing() -> None:
    (useradd,) = commands(UserspaceHost({}, state(VERSION, user=False)))
    assert "useradd --system" in useradd and useradd.endswith(" nvidia-persistenced")


def fabric_commands(package: str, enabled: str = "enabled") -> tuple[list[str], list[str]]:
    spec_ = HostSpec.model_validate(spec(installer=RUN, fabricmanager=FABRIC))
    wanted = make_plan("kpro6", spec_, kpro6(**with_nvswitch())).driver_userspace
    lines = [line if line != "package=" else f"package={package}" for line in state(VERSION)]
    lines.append(f"enabled={enabled}")
    host = UserspaceHost({}, lines)
    context._observed.clear()
    with ctx_host.use(host), ctx_state.use(host.state):
        out = [
            c if isinstance(c, str) else f"upload {c.src} {c.dest}"
            for c in userspace.fabricmanager_installed._inner(wanted=wanted)
        ]
    context._observed.clear()
    return out, host.noops


ENABLE = (
    f"systemctl enable nvidia-fabricmanager.service && if grep -qsF ' {VERSION} ' "
    "/proc/driver/nvidia/version; then systemctl restart nvidia-fabricmanager.service; fi"
)


def test_the_fabric_manager_of_the_version_is_installed_and_enabled() -> None:
    assert fabric_commands(f"{VERSION}-1") == (
        [],
        [f"nvidia-fabricmanager {VERSION} is installed and enabled"],
    )
    (mkdir, upload, install, enable), _ = fabric_commands("580.105.08-1")
    assert mkdir == "mkdir -p /var/lib/gpuhost/driver-installer"
    remote = f"/var/lib/gpuhost/driver-installer/{FABRIC.rsplit('/')[-1]}"
    assert upload == f"upload {FABRIC} {remote}"
    # The package's own fields are checked before dpkg runs; dpkg's record after it.
    assert install.startswith(f"pkg=$(dpkg-deb -f {remote} Package) && ")
    assert install.index('case "$pkg/$ver"') < install.index(f"dpkg -i {remote}")
    assert f"wanted nvidia-fabricmanager {VERSION}" in install
    assert f"wanted {VERSION}" in install and install.endswith(f"rm -f {remote}")
    assert enable == ENABLE  # started now only on a loaded driver of its version


def test_a_disabled_fabric_manager_is_enabled_again_without_reinstalling() -> None:
    assert fabric_commands(f"{VERSION}-1", enabled="disabled") == ([ENABLE], [])
