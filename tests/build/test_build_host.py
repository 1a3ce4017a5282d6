"""`gpuhost build` on a build host (artifacts.build_host): the real kernel build, run over real SSH
on the build host into the store there, and that store read back the way deploys read it.

The build host is this machine behind its own sshd (tests/build/sshd.py), with the compiler
wrapper first on its sessions' PATH, logging every call: the store, tree, work directory and
compiler are the build host's, reached only through SSH. The build is the one
tests/build/kernel_cache.py caches, so its key must come out the same; its store is new, so the
build really runs there (minutes, once per test run): tests/build/killed_build.py's scenario,
either the one that filled a cold kernel cache in this test run or, with the cache warm, one
run here.
"""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest

from gpuhost.build import host as buildhost
from gpuhost.build.artifacts import ArtifactError, ArtifactKey, ArtifactStore
from gpuhost.build.kernel import configure
from gpuhost.build.remotestore import RemoteStore
from tests.build import killed_build
from tests.build.kernel_cache import (
    CC_LOG,
    BuiltKernel,
    compiler_on_path,
    killed_build_dir,
    recipe,
    source_tree,
    wrapper_dir,
)
from tests.build.killed_build import KilledBuild, cc_calls, compiled, gpuhost_build, inventory
from tests.build.sshd import LocalBuildHost, free_port, local_build_host


@pytest.fixture(scope="module")
def builder(built_kernel: BuiltKernel, tmp_path_factory) -> LocalBuildHost:
    where = tmp_path_factory.mktemp("builder")
    with local_build_host(where / "ssh", [wrapper_dir()], {CC_LOG: str(where / "cc.log")}) as bh:
        yield bh


def builder_calls(builder: LocalBuildHost) -> list[str]:
    return cc_calls(builder.key.parents[1] / "cc.log")


@pytest.fixture(scope="module")
def remote_build(built_kernel, run_id, tmp_path_factory) -> KilledBuild:
    """The one real build over SSH, into a new store on the build host: its first `gpuhost
    build` is killed mid-build (its SSH connection gone), the build runs on there to its end,
    and the next `gpuhost build` waits for it and reports it stored, with no second build.
    Where it filled the kernel cache in this test run (built_kernel), that one; else run here."""
    filled = killed_build.load(killed_build_dir(run_id))
    return filled or killed_build.run(tmp_path_factory.mktemp("remote") / "run", wrapper_dir())


def test_a_killed_build_runs_on_there_and_the_next_run_waits_for_it(
    remote_build, builder, built_kernel, tmp_path
):
    done = remote_build
    assert done.error == "", done.error
    assert done.killed_with_debs == []  # not finished when the client went
    assert done.returncode == 0, done.stdout + done.stderr
    (key,) = ArtifactStore(done.store).keys("kernel", built_kernel.release, built_kernel.release)
    where = f"builder:{done.store / key.path}"
    assert done.stdout == f"kb: already in the store: {where}\n"
    # The build host's compiler ran (the wrapper its PATH has), for one build, not two: the
    # first program Kbuild compiles (before the kill) and a kernel object (after it) once each;
    # a second build, in a scratch directory of its own, would have compiled both again.
    calls = done.calls()
    assert len(calls) > 100
    assert compiled(calls, "scripts/basic/fixdep") == 1, [c for c in calls if "fixdep" in c]
    assert compiled(calls, "kernel/sched/core.o") == 1
    # It made the control machine's kernel exactly: same release, compiler string and config
    # hash as the same recipe configured here (Kconfig only), and the cached kernel's key.
    with compiler_on_path():
        here = configure(recipe(source_tree()), tmp_path / "obj")
    assert key == ArtifactKey("kernel", here.release, here.release, here.compiler, here.config_hash)
    assert key == ArtifactStore(built_kernel.store).keys("kernel", key.version, key.kernel)[0]
    assert key.compiler == built_kernel.compiler
    # Both runs' scratch directories go: the waiting run's at once, the killed run's when its
    # build, running on without a client, has stored its result and cleans up after itself.
    deadline = time.monotonic() + 120
    while list(done.work.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert list(done.work.iterdir()) == []
    # Run again: the build host hashes its inputs and finds the build; nothing compiles.
    inv = inventory(tmp_path / "inv.py", builder, done.store)
    before = len(builder_calls(builder))
    third = gpuhost_build(inv)
    assert third.returncode == 0, third.stderr
    assert third.stdout == f"kb: already in the store: {where}\n"
    assert len(builder_calls(builder)) == before


def test_deploys_read_the_build_hosts_store_through_a_verified_mirror(
    remote_build, builder, built_kernel, tmp_path
):
    store = remote_build.store
    assert remote_build.returncode == 0, remote_build.stdout + remote_build.stderr
    host = buildhost.connect(
        "builder", {**builder.host_data(), "ssh_strict_host_key_checking": "yes"}
    )
    try:
        remote = RemoteStore(host, str(store), tmp_path / "mirror")
        assert remote.root == f"builder:{store}"
        (key,) = remote.keys("kernel", built_kernel.release, built_kernel.release)
        assert remote.keys("kernel", "6.9.9-1-pve", "6.9.9-1-pve") == []
        artifact = remote.get(key)
        assert artifact is not None and artifact.directory.is_relative_to(tmp_path / "mirror")
        assert (
            artifact.files == json.loads((store / key.path / "manifest.json").read_text())["files"]
        )
        assert remote.get(ArtifactKey("kernel", "6.9.9-1-pve", "6.9.9-1-pve", key.compiler)) is None
        # A second read takes the mirror as it is (the manifests agree; its files verified).
        mtimes = {n: artifact.file(n).stat().st_mtime_ns for n in artifact.files}
        assert remote.get(key) == artifact
        assert {n: artifact.file(n).stat().st_mtime_ns for n in artifact.files} == mtimes
        # A file damaged on the build host: refused, named, and the mirror keeps its good copy.
        deb = next(n for n in artifact.files if n.startswith("linux-image-"))
        remote_copy = store / key.path / deb
        saved = remote_copy.with_name(remote_copy.name + ".good")
        shutil.copy2(remote_copy, saved)
        try:
            with remote_copy.open("r+b") as f:
                f.seek(1000)
                f.write(b"\0" * 16)
            artifact.file(deb).write_bytes(b"changed in the mirror")  # and the mirror's too
            with pytest.raises(
                ArtifactError, match=re.escape(f"builder:{store / key.path / deb}: its sha256")
            ):
                remote.get(key)
        finally:
            saved.replace(remote_copy)
        assert remote.get(key).files == artifact.files  # fetched again, verified
    finally:
        host.disconnect()


def test_an_unreachable_build_host_is_named(builder, built_kernel, tmp_path):
    closed = LocalBuildHost(free_port(), builder.key, builder.known_hosts)  # nothing listens
    done = gpuhost_build(inventory(tmp_path / "inv.py", closed, tmp_path / "store"))
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.startswith("gpuhost: build host builder: cannot connect"), done.stderr
    nokey = LocalBuildHost(builder.port, tmp_path / "no-such-key", builder.known_hosts)
    done = gpuhost_build(inventory(tmp_path / "inv2.py", nokey, tmp_path / "store"))
    assert done.returncode != 0
    assert "build host builder: cannot connect: No such private key file" in done.stderr
