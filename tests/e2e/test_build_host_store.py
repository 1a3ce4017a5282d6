"""A host provisioned from a build host's store (artifacts.build_host): the deploy lists the
kernel in the store on the build host over SSH, fetches it into the control machine's mirror
(checked against the build host's manifest) and installs it; the trial boot, gate and pin
follow as from a local store, and a second run changes nothing and fetches nothing.

The build host is this machine behind its own sshd (tests/build/sshd.py), whose store is the
one the cached test kernel lives in (tests/build/kernel_cache.py): the remote build itself is
tests/build/test_build_host.py's.
"""

from __future__ import annotations

import pytest

from tests.build.sshd import local_build_host
from tests.e2e.conftest import deploy
from tests.e2e.reprovision import provision
from tests.e2e.test_reprovision import check_restored

pytestmark = pytest.mark.twin


def test_a_host_is_provisioned_from_the_build_hosts_store(fresh, built_kernel, tmp_path):
    mirror = tmp_path / "mirror"
    with local_build_host(tmp_path / "builder") as builder:
        artifacts = {
            "store": str(built_kernel.store),
            "build_host": "builder",
            "mirror": str(mirror),
        }
        first = provision(
            fresh, built_kernel, tmp_path, "first", artifacts, builder.entry("builder")
        )
        check_restored(first, built_kernel.release)
        debs = sorted(p.name for p in mirror.rglob("*.deb"))
        assert debs == [
            f"linux-headers-{built_kernel.release}_1_amd64.deb",
            f"linux-image-{built_kernel.release}_1_amd64.deb",
        ]
        fetched = {p: p.stat().st_mtime_ns for p in mirror.rglob("*") if p.is_file()}
        again = deploy(first.inventory)
        assert again.rc == 0 and not again.changed, again.output[-3000:]
        assert {p: p.stat().st_mtime_ns for p in mirror.rglob("*") if p.is_file()} == fetched
    # The build host down (its sshd stopped): a converged host needs nothing from it, so the
    # run does not even connect to it, and reports no change.
    down = deploy(first.inventory)
    assert down.rc == 0 and not down.changed, down.output[-3000:]
