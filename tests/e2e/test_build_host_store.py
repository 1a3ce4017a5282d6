"""A host provisioned from a build host's store (artifacts.build_host): the deploy lists the
kernel in the store on the build host over SSH, fetches it into the control machine's mirror
(checked against the build host's manifest) and installs it; the trial boot, gate and pin
follow as from a local store, and a second run changes nothing and fetches nothing. With the
build host down a converged host still converges; a reinstalled one stops, naming it, before
anything changes; and with it back a wiped host is restored with no compiler run on it.

The build host is this machine behind its own sshd (tests/build/sshd.py), whose store is the
one the cached test kernel lives in (tests/build/kernel_cache.py): the remote build itself is
tests/build/test_build_host.py's.
"""

from __future__ import annotations

import shutil

from tests.build.sshd import local_build_host
from tests.e2e.conftest import deploy
from tests.e2e.reprovision import OLD, provision
from tests.e2e.test_reprovision import check_restored


def artifacts(built_kernel, mirror) -> dict:
    return {"store": str(built_kernel.store), "build_host": "builder", "mirror": str(mirror)}


def test_a_host_is_provisioned_from_the_build_hosts_store(fresh, built_kernel, tmp_path):
    mirror = tmp_path / "mirror"
    with local_build_host(tmp_path / "builder") as builder:
        first = provision(
            fresh,
            built_kernel,
            tmp_path,
            "first",
            artifacts(built_kernel, mirror),
            builder.entry("builder"),
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

    # A bricked host reinstalled while the build host is down: the run stops, naming it,
    # before anything changes on the host.
    shutil.rmtree(mirror)
    stranded = provision(
        fresh,
        built_kernel,
        tmp_path,
        "stranded",
        artifacts(built_kernel, mirror),
        builder.entry("builder"),
    )
    assert stranded.run.rc != 0
    assert "build host builder: cannot connect" in stranded.run.output, stranded.run.output[-3000:]
    assert stranded.twin.run("uname -r")[1].strip() == OLD
    assert stranded.twin.run(f"ls /boot/config-{built_kernel.release}")[0] != 0
    rc, out, _ = stranded.twin.run("proxmox-boot-tool kernel list")
    assert rc == 0 and "Pinned kernel" not in out  # not even the pin of the running kernel

    # With the build host back, a wiped host (and a new control machine: an empty mirror) is
    # restored from its store, with no compiler run on the host.
    with local_build_host(tmp_path / "builder-again") as builder:
        wiped = provision(
            fresh,
            built_kernel,
            tmp_path,
            "wiped",
            artifacts(built_kernel, mirror),
            builder.entry("builder"),
        )
    check_restored(wiped, built_kernel.release)
    assert "(from the store)" in wiped.run.output  # the NVIDIA modules, from the driver store
    assert wiped.compiler_runs == []
