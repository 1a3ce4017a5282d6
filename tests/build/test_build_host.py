"""`gpuhost build` on a build host (artifacts.build_host): the real kernel build, run over real SSH
on the build host into the store there, and that store read back the way deploys read it.

The build host is this machine behind its own sshd (tests/build/sshd.py), with the compiler
wrapper first on its sessions' PATH, logging every call: the store, tree, work directory and
compiler are the build host's, reached only through SSH. The build is the one
tests/build/kernel_cache.py caches, so its key must come out the same; the store is new, so the
build really runs there (minutes, once per test run).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuhost import buildhost
from gpuhost.artifacts import ArtifactError, ArtifactKey, ArtifactStore
from gpuhost.remotestore import RemoteStore
from tests.build.kernel_cache import (
    CC_LOG,
    BuiltKernel,
    build_record,
    cache_dir,
    source_tree,
    spec,
    wrapper_dir,
)
from tests.build.sshd import LocalBuildHost, free_port, local_build_host

GPUHOST = Path(sys.executable).parent / "gpuhost"


@pytest.fixture(scope="module")
def builder(built_kernel: BuiltKernel, tmp_path_factory) -> LocalBuildHost:
    where = tmp_path_factory.mktemp("builder")
    log = where / "cc.log"
    with local_build_host(where / "ssh", [wrapper_dir()], {CC_LOG: str(log)}) as bh:
        yield bh


def cc_calls(builder: LocalBuildHost) -> list[str]:
    log = builder.key.parents[1] / "cc.log"
    return (
        [line for line in log.read_text().splitlines() if "--version" not in line]
        if log.is_file()
        else []
    )


def inventory(path: Path, builder: LocalBuildHost, store: Path, work: Path) -> Path:
    host = {**spec(source_tree(), store), "driver": {"version": "595.71.05"}}
    host["artifacts"] = {"store": str(store), "build_host": "builder"}
    path.write_text(
        "from gpuhost.inventory import build_host, gpu_host\n"
        f"{builder.entry('builder')}\n"
        f"gpu_hosts = [gpu_host('kb', ssh_hostname='192.0.2.1', spec={host!r})]\n"
    )
    return path


def gpuhost_build(inv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(GPUHOST), "build", str(inv), *args], capture_output=True, text=True, timeout=3600
    )


@pytest.fixture(scope="module")
def remote_build(builder, built_kernel, tmp_path_factory):
    """The one real build over SSH, into a new store on the build host: its first `gpuhost
    build` is killed mid-build (its SSH connection gone), the build runs on there to its end,
    and the next `gpuhost build` waits for it and reports it stored, with no second build."""
    tmp = tmp_path_factory.mktemp("remote")
    store, work = tmp / "store", tmp / "work"
    work.mkdir()
    inv = inventory(tmp / "inv.py", builder, store, work)
    before = len(cc_calls(builder))
    first = subprocess.Popen(
        [str(GPUHOST), "build", str(inv), "--work", str(work)], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 600
    while len(cc_calls(builder)) < before + 20:  # it compiles there
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.5)
    first.kill()
    first.communicate()
    killed_with_debs = sorted(p.name for p in store.rglob("*.deb"))
    again = gpuhost_build(inv, "--work", str(work))
    return inv, store, work, again, killed_with_debs, len(cc_calls(builder)) - before


def test_a_killed_build_runs_on_there_and_the_next_run_waits_for_it(
    remote_build, builder, built_kernel
):
    inv, store, work, again, killed_with_debs, calls = remote_build
    assert killed_with_debs == []  # not finished when the client went
    assert again.returncode == 0, again.stdout + again.stderr
    (key,) = ArtifactStore(store).keys("kernel", built_kernel.release, built_kernel.release)
    where = f"builder:{store / key.path}"
    assert again.stdout == f"kb: already in the store: {where}\n"
    # The build host's compiler ran (the wrapper its PATH has), once: one build's calls, not two.
    cached = ArtifactStore(built_kernel.store).get(key)
    one_build = build_record(cache_dir(), cached).get("compiler_calls", 1100)
    assert 100 < calls < 1.5 * one_build, (calls, one_build)
    # It made the cached kernel exactly: same release, compiler string and config hash as the
    # control machine's build of the same recipe.
    assert key == ArtifactStore(built_kernel.store).keys("kernel", key.version, key.kernel)[0]
    assert key.compiler == built_kernel.compiler
    # Both runs' scratch directories go: the waiting run's at once, the killed run's when its
    # build, running on without a client, has stored its result and cleans up after itself.
    deadline = time.monotonic() + 120
    while list(work.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert list(work.iterdir()) == []
    # Run again: the build host hashes its inputs and finds the build; nothing compiles.
    before = len(cc_calls(builder))
    third = gpuhost_build(inv)
    assert third.returncode == 0, third.stderr
    assert third.stdout == f"kb: already in the store: {where}\n"
    assert len(cc_calls(builder)) == before


def test_deploys_read_the_build_hosts_store_through_a_verified_mirror(
    remote_build, builder, built_kernel, tmp_path
):
    _, store, _, done, _, _ = remote_build
    assert done.returncode == 0, done.stdout + done.stderr
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
    done = gpuhost_build(inventory(tmp_path / "inv.py", closed, tmp_path / "store", tmp_path))
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.startswith("gpuhost: build host builder: cannot connect"), done.stderr
    nokey = LocalBuildHost(builder.port, tmp_path / "no-such-key", builder.known_hosts)
    done = gpuhost_build(inventory(tmp_path / "inv2.py", nokey, tmp_path / "store", tmp_path))
    assert done.returncode != 0
    assert "build host builder: cannot connect: No such private key file" in done.stderr
