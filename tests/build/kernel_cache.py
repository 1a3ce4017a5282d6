"""One real kernel, built once per machine, for the tests that need its .debs.

``built_kernel_store()`` builds Debian's linux-source-6.1 (tinyconfig plus a few options, a
64-bit x86_64 kernel with loadable modules) into .deb packages with gcc-12, through gpuhost's
own build (``gpuhost.build.kernel.build``: the recipe ``gpuhost build`` makes from a spec like
``spec()``'s, into the same store layout), and returns where they are. The first call on a
machine builds (minutes): `gpuhost build` over SSH to this machine, killed mid-build and run
again (tests/build/killed_build.py, the scenario test_build_host.py checks), so that a clean
machine builds it once for both. Later calls, in this process or any other, find the build in
the store through its inputs hash and run neither make nor the compiler.

The cache is ``$GPUHOST_TEST_CACHE`` (default ``/var/cache/gpuhost-test``):

    src/<tarball id>/linux-source-6.1/   the tarball, unpacked once (the tree is never written)
    bin/gcc-12                           the compiler the build runs: logs each call to
                                         $GPUHOST_TEST_CC_LOG when that is set, then runs gcc-12
    store/                               an artifact store (kernel/..., kernel-inputs/...)
    builds/<inputs hash>.json            what the real build took: seconds, compiler calls
    killed-build/<test run>/             the killed remote build that filled the cache
    lock                                 held while unpacking or building (concurrent runs wait)

The compiler is the wrapper for every build (the inputs hash covers its bytes); Kconfig records
the real gcc-12's ``--version`` line, so the packages say ``gcc-12 (Debian ...) 12.2.0``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from gpuhost.build.artifacts import Artifact, ArtifactKey, ArtifactStore
from gpuhost.build.kernel import (
    INDEX,
    KernelRecipe,
    inputs_hash,
    local_jobs,
    lookup,
    tree_version,
)
from gpuhost.build.kernelbuild import build

TARBALL = Path("/usr/src/linux-source-6.1.tar.xz")
APT_PACKAGES = Path(__file__).with_name("APT_PACKAGES")
LOCALVERSION = "-1-pve"  # the release then reads like a Proxmox one: 6.1.<sublevel>-1-pve
CC = "gcc-12"
GCC = "12.2.0"  # the spec's toolchain.gcc for that compiler
BASE_CONFIG = "tinyconfig"
# On top of tinyconfig: a 64-bit kernel (ARCH=x86_64 makes it so; stated, so that Kconfig
# dropping it is refused by name), loadable and unloadable modules (what the headers .deb is
# for) and what a kernel needs to start from an initramfs at all.
FRAGMENT = {
    "CONFIG_64BIT": "y",
    "CONFIG_MODULES": "y",
    "CONFIG_MODULE_UNLOAD": "y",
    "CONFIG_BLK_DEV_INITRD": "y",
    "CONFIG_PRINTK": "y",
    "CONFIG_BINFMT_ELF": "y",
}
CC_LOG = "GPUHOST_TEST_CC_LOG"
WRAPPER = f"""#!/bin/sh
# gpuhost tests: the kernel build's compiler. Logs the call, then runs the real {CC}.
if [ -n "${CC_LOG}" ]; then printf '%s\\n' "$*" >>"${CC_LOG}"; fi
exec /usr/bin/{CC} "$@"
"""


class BuiltKernel(NamedTuple):
    store: Path  # the artifact store that holds it (ArtifactStore(store))
    release: str  # e.g. 6.1.158-1-pve: kernel.version of a spec that installs it
    compiler: str  # its CONFIG_CC_VERSION_TEXT, e.g. gcc-12 (Debian 12.2.0-14+deb12u1) 12.2.0


def cache_dir() -> Path:
    return Path(os.environ.get("GPUHOST_TEST_CACHE", "/var/cache/gpuhost-test"))


def missing() -> list[str]:
    """What this machine lacks for the build (empty: it can run), for a skip message."""
    lacking = []
    if os.geteuid() != 0:
        lacking.append("root")
    names = sorted(
        {w for line in APT_PACKAGES.read_text().splitlines() for w in line.split("#")[0].split()}
    )
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", *names],
        capture_output=True,
        text=True,
        check=False,
    )
    installed = {
        line.split()[0] for line in done.stdout.splitlines() if line.endswith(" installed")
    }
    absent = [n for n in names if n not in installed]
    if absent:
        lacking.append(
            f"Debian packages {' '.join(absent)} (tests/build/APT_PACKAGES; ./gpuhost-setup)"
        )
    elif not TARBALL.is_file():
        lacking.append(str(TARBALL))
    return lacking


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def wrapper_dir(cache: Path | None = None) -> Path:
    """The directory whose ``gcc-12`` is the logging wrapper (put it first on PATH)."""
    bindir = (cache or cache_dir()) / "bin"
    wrapper = bindir / CC
    if not wrapper.is_file() or wrapper.read_text() != WRAPPER:
        bindir.mkdir(parents=True, exist_ok=True)
        tmp = bindir / f".{CC}.{os.getpid()}"
        tmp.write_text(WRAPPER)
        tmp.chmod(0o755)
        tmp.rename(wrapper)
    return bindir


@contextmanager
def compiler_on_path(log: Path | None = None, cache: Path | None = None) -> Iterator[Path]:
    """PATH with the wrapper first (and, with ``log``, every compiler call logged to it) for
    this process and its children, restored afterwards. Yields the wrapper directory."""
    bindir = wrapper_dir(cache)
    saved = {name: os.environ.get(name) for name in ("PATH", CC_LOG)}
    os.environ["PATH"] = f"{bindir}:{saved['PATH'] or '/usr/bin:/bin'}"
    if log is not None:
        os.environ[CC_LOG] = str(log)
    else:
        os.environ.pop(CC_LOG, None)
    try:
        yield bindir
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def source_tree(cache: Path | None = None) -> Path:
    """The tarball unpacked under the cache, once per tarball (keyed by its size and mtime)."""
    cache = cache or cache_dir()
    st = TARBALL.stat()
    ident = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:12]
    tree = cache / "src" / ident / "linux-source-6.1"
    if (tree / "Makefile").is_file():
        return tree
    with _locked(cache):
        if (tree / "Makefile").is_file():
            return tree
        tree.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=tree.parent))
        try:
            subprocess.run(["tar", "-xJf", str(TARBALL), "-C", str(staging)], check=True)
            (staging / tree.name).rename(tree)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tree


def release_of(tree: Path) -> str:
    return tree_version(tree) + LOCALVERSION


def recipe(tree: Path, **changes) -> KernelRecipe:
    """The recipe `gpuhost build` makes from ``spec(tree)`` (``changes`` override fields)."""
    fields = dict(
        tree=tree,
        base_config=BASE_CONFIG,
        release=release_of(tree),
        localversion=LOCALVERSION,
        cc=CC,
        fragment=dict(FRAGMENT),
    )
    return KernelRecipe(**{**fields, **changes})


def spec(tree: Path, store: Path) -> dict:
    """A host spec whose kernel is this build (for inventories: `gpuhost build`, deploys)."""
    return {
        "kernel": {
            "version": release_of(tree),
            "source": "build",
            "build": {"repo": str(tree), "base_config": BASE_CONFIG, "config": dict(FRAGMENT)},
        },
        "toolchain": {"gcc": GCC},
        "artifacts": {"store": str(store)},
    }


def build_record(cache: Path, artifact: Artifact) -> dict:
    """What the real build of ``artifact`` took (seconds, compiler calls), as it recorded."""
    path = cache / "builds" / f"{artifact.meta['inputs']}.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _drop_others(store: ArtifactStore, key: ArtifactKey) -> None:
    """Keep this release in the store as this recipe's build only: a deploy refuses to choose
    between two configs of one release (an older FRAGMENT's build would be the second)."""
    for other in store.keys(key.kind, key.version, key.kernel):
        if other != key:
            shutil.rmtree(store.root / other.path, ignore_errors=True)
    for index in (store.root / INDEX).glob("*.json"):
        if not (store.root / ArtifactKey(**json.loads(index.read_text())).path).is_dir():
            index.unlink()  # it named a build just removed


def killed_build_dir(run: str, cache: Path | None = None) -> Path:
    """Where the test run ``run`` filled the cache through the killed remote build."""
    return (cache or cache_dir()) / "killed-build" / run


def built_kernel_store(run: str | None = None) -> BuiltKernel:
    """The kernel's store, release and compiler text, building it first if this machine has
    not. Call ``missing()`` first to skip where it cannot run (root, packages).

    The build that fills the cache is tests/build/killed_build.py's (over SSH on this machine,
    its first client killed mid-build), kept as test run ``run``'s (killed_build_dir) for
    test_build_host.py to check, so that a clean machine builds the kernel once, not twice.
    Where that build stored nothing, the kernel is built here, directly."""
    cache = cache_dir()
    tree = source_tree(cache)
    store = ArtifactStore(cache / "store")
    with _locked(cache):
        with compiler_on_path(None, cache):
            found = lookup(store, inputs_hash(recipe(tree)))
        if found is None:
            found = _fill_over_ssh(cache, store, run or uuid.uuid4().hex)
        if found is None:
            found = _build_here(cache, store, tree)
        _drop_others(store, found.key)
    return BuiltKernel(store.root, found.key.version, found.key.compiler)


def _fill_over_ssh(cache: Path, store: ArtifactStore, run: str) -> Artifact | None:
    """The killed remote build into a new store, its kernel then copied into ``store`` (with
    its inputs-index entry and the build record); None when it stored no kernel."""
    from tests.build import killed_build  # it imports this module

    shutil.rmtree(cache / "killed-build", ignore_errors=True)  # earlier runs' (the lock is held)
    where = killed_build_dir(run, cache)
    done = killed_build.run(where, wrapper_dir(cache), cache)
    release = release_of(source_tree(cache))
    keys = ArtifactStore(done.store).keys("kernel", release, release)
    built = ArtifactStore(done.store).get(keys[0]) if len(keys) == 1 else None
    if built is None:
        return None
    digest = built.meta["inputs"]
    artifact = store.put(built.key, [built.file(name) for name in built.files], built.meta)
    index = store.root / INDEX / f"{digest}.json"  # as gpuhost.build.kernel records a build
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(json.dumps(built.key.__dict__, sort_keys=True) + "\n")
    _record(cache, digest, done.seconds, len(done.calls()), built.meta.get("jobs"), where)
    return artifact


def _build_here(cache: Path, store: ArtifactStore, tree: Path) -> Artifact:
    work = Path(tempfile.mkdtemp(prefix="work-", dir=cache))
    log = work.with_name(f"{work.name}.cc-log")
    try:
        with compiler_on_path(log, cache):
            started = time.monotonic()
            result = build(recipe(tree), store, work / "out", local_jobs())
            seconds = round(time.monotonic() - started, 1)
        if not result.cached:
            calls = len(log.read_text().splitlines()) if log.is_file() else 0
            _record(cache, result.artifact.meta["inputs"], seconds, calls, local_jobs(), None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        log.unlink(missing_ok=True)
    return result.artifact


def _record(
    cache: Path, digest: str, seconds: float, calls: int, jobs: int | None, over: Path | None
) -> None:
    """builds/<inputs hash>.json: what the real build took (``over``: the killed remote
    build's directory, when that was the build)."""
    record = {"seconds": seconds, "compiler_calls": calls, "jobs": jobs}
    if over is not None:
        record["killed_build"] = str(over)
    path = cache / "builds" / f"{digest}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(record) + "\n")


if __name__ == "__main__":  # python -m tests.build.kernel_cache: build (or find) it, say where
    lacking = missing()
    if lacking:
        raise SystemExit(f"cannot build: missing {', '.join(lacking)}")
    print(built_kernel_store())
