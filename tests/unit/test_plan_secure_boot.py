"""Secure Boot: what the firmware and the locked-down kernel would refuse is refused by the plan
before the first change (gpuhost/plan/secure_boot.py); the real refusals are shown in
tests/vm/test_secure_boot.py."""

from __future__ import annotations

import pytest

from gpuhost.plan.secure_boot import check_secure_boot
from tests.unit.hosts import kpro6
from tests.unit.test_plan import KPRO6, host, refused

RUNNING = "6.8.12-9-pve"  # kpro6's kernel, running the spec's driver 580.95.05
BUILT = {"version": "6.14.8-2-bpo12-pve", "source": "build", "build": {"repo": "/src"}}
SOURCE = {"tree": "/src/open-gpu-kernel-modules", "store": "/srv/gpuhost-store"}


def boot_path(secure_boot: int, setup_mode: int = 0) -> tuple[int, list[str]]:
    return (0, ["uefi yes", f"sbvar SecureBoot 06000000{secure_boot:02x}",
                f"sbvar SetupMode 06000000{setup_mode:02x}"])  # fmt: skip


def problems(spec: dict, secure_boot: int = 1, setup_mode: int = 0) -> list[str]:
    found: list[str] = []
    check_secure_boot(host(spec), kpro6(BootPath=boot_path(secure_boot, setup_mode)), found)
    return found


def test_a_kernel_gpuhost_builds_is_refused_under_secure_boot() -> None:
    spec = {**KPRO6, "kernel": BUILT}
    (problem,) = problems(spec)
    assert "kernel.source: build" in problem and "bad shim signature" in problem
    assert "turn Secure Boot off in the firmware setup" in problem
    assert problem in refused(host(spec), kpro6(BootPath=boot_path(1)))  # make_plan says it
    assert problems(spec, secure_boot=0) == problems(spec, setup_mode=1) == []


def test_modules_gpuhost_builds_are_refused_under_secure_boot() -> None:
    spec = {**KPRO6, "kernel": BUILT, "driver": {**KPRO6["driver"], "source": SOURCE}}
    _, modules = problems(spec)
    assert "driver.source" in modules and "loads no unsigned module" in modules
    assert problems(spec, secure_boot=0) == []


@pytest.mark.parametrize(
    "spec",
    [
        KPRO6,  # Proxmox's kernel, a driver gpuhost does not install
        {**KPRO6, "kernel": {**BUILT, "version": RUNNING}},  # its own build already runs
        # the running kernel already loaded the spec's driver: nothing new to load
        {**KPRO6, "driver": {**KPRO6["driver"], "source": SOURCE}},
    ],
)
def test_what_the_host_already_runs_is_not_refused(spec: dict) -> None:
    assert problems(spec) == []
