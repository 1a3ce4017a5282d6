"""Reprovisioning a bricked host (issue 9's story, tests/e2e/reprovision.py): the real kernel
from the store and the driver, trial-booted, audited, pinned; a second run changes nothing; a
wiped twin with the same spec and stores is restored with zero compiler runs on it."""

from __future__ import annotations

from tests.e2e.conftest import deploy
from tests.e2e.guests import audit
from tests.e2e.reprovision import VERSION, Provisioned, provision


def check_restored(p: Provisioned, release: str) -> None:
    assert p.run.rc == 0, p.run.output[-5000:]
    assert f"Kernel {release} (from the store, built by gcc-12 (Debian 12.2.0" in p.run.output
    assert f"kernel {release} passed its trial boot" in p.run.output
    assert p.twin.run("uname -r")[1].strip() == release
    rc, out, _ = p.twin.run("proxmox-boot-tool kernel list")
    assert rc == 0 and f"Pinned kernel:\n{release}" in out
    rc, out, _ = p.twin.run("cat /proc/driver/nvidia/version")
    assert rc == 0 and f"Open Kernel Module for x86_64  {VERSION}" in out
    assert audit(p.twin, p.inventory) == {}


def test_a_fresh_host_is_provisioned_then_a_wiped_one_restored_without_compiling(
    fresh, built_kernel, tmp_path
):
    first = provision(fresh, built_kernel, tmp_path, "first")
    check_restored(first, built_kernel.release)
    assert any("gcc-12" in line for line in first.compiler_runs)  # the modules, built there
    again = deploy(first.inventory)
    assert again.rc == 0 and not again.changed, again.output[-3000:]

    wiped = provision(fresh, built_kernel, tmp_path, "wiped")
    check_restored(wiped, built_kernel.release)
    assert "(from the store)" in wiped.run.output  # the modules too
    assert wiped.compiler_runs == []
