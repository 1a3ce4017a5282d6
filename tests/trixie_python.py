"""gpuhost under Debian 13's Python 3.13, on a Debian 12 machine: a venv made inside the twin's
trixie base (tests/e2e/test_python313.py runs the unit tier and the CLI against a twin in it).

trixie's python3.13 needs trixie's glibc, so everything runs chrooted into the base, in a mount
and PID namespace of its own (``unshare``): an overlay of a cached layer over the base, and one
over the checkout (on /src), both writable through a tmpfs, with proc and a read-only sysfs; when
the command ends, its processes, the namespace and every mount in it are gone, and the base, the
layer and the checkout were never written to. The network is the machine's: twins on 127.0.0.N
answer.

The wheels come from this machine's pip configuration (``pip download`` of cp313 wheels for the
base's glibc, binary only), pinned to the versions of the venv running the tests (the 3.11 venv
./gpuhost-setup made from pyproject.toml): both interpreters test the same dependencies. The
layer holds the venv, made inside the base with uv (the host venv's binary; trixie's python3.13
has no ensurepip) from those wheels only, gpuhost and gpuhost-twin installed editable from /src,
and the tools some unit tests run (TOOLS: trixie's, with apt from the base's own sources). All is
cached under ``$GPUHOST_TEST_CACHE/python313`` (default /var/cache/gpuhost-test), keyed:

    wheels-<pins, interpreter>/       the wheels, pins.txt and pip's log
    layer-<wheels, base, recipe>/up   the overlay layer: /opt/gpuhost-py313 and TOOLS
    pycache/                          bytecode (PYTHONPYCACHEPREFIX), kept across runs
    twin-cache/                       the chroot's /var/cache/gpuhost-twin (built .ko files)
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.build.kernel_cache import cache_dir

ROOT = Path(__file__).parents[1]
SRC = "/src"  # the checkout, inside
VENV = "/opt/gpuhost-py313"
WHEELS = "/mnt/wheels"
PYTHON = "/usr/bin/python3"  # the base's python3: 3.13 on trixie
# What unit tests run besides Python, where the trixie base lacks it (./gpuhost-setup installs
# them on the Debian 12 machine): git (kernel sources by URL), dpkg-dev (pve-kernel's Makefile
# includes its pkg-info.mk), gcc (the NVIDIA installer stand-in). Not gcc-12: the real module
# builds of the twin's hardware tests are Debian 12's (gcc-12, bookworm's headers; trixie's
# headers need GCC 14), so those skip here, saying so, and run in the 3.11 suite.
TOOLS = ("git", "dpkg-dev", "gcc")
# Ours (installed editable from /src), and the installer's own, which the venv does not need.
UNPINNED = frozenset({"gpuhost", "gpuhost-twin", "pip", "setuptools", "wheel"})
BUILD_REQUIRES = "setuptools>=68"  # pyproject's build-system, for the editable installs
STALE_DAYS = 7  # other keys' wheels and layers no run used for this long are removed

# In a fresh mount and PID namespace: $1 a directory for the tmpfs, $2 the overlay's lower
# directories, $3 its upper one ("": on the tmpfs), $4 the checkout, then binds
# ("host-path:path-inside:ro|rw", ending at "--"), then the command.
ENTER = r"""set -eu
top=$1 lower=$2 upper=$3 src=$4; shift 4
mount -t tmpfs -o mode=755 gpuhost-py313 "$top"
mkdir "$top/up" "$top/wk" "$top/root" "$top/src-up" "$top/src-wk"
if [ -z "$upper" ]; then upper=$top/up work=$top/wk; else work=$upper/../wk; fi
r=$top/root
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$r"
mount -t proc -o nosuid,nodev,noexec proc "$r/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$r/sys"
mkdir -p "$r/src"
mount -t overlay overlay -o "lowerdir=$src,upperdir=$top/src-up,workdir=$top/src-wk" "$r/src"
while [ "$1" != -- ]; do
    from=${1%%:*} rest=${1#*:}; to=${rest%:*} mode=${rest##*:}; shift
    if [ -d "$from" ]; then mkdir -p "$r$to"
    elif [ ! -e "$r$to" ]; then mkdir -p "$(dirname "$r$to")"; : >"$r$to"; fi
    mount --bind "$from" "$r$to"
    if [ "$mode" = ro ]; then mount -o remount,bind,ro "$r$to"; fi
done
shift
exec chroot "$r" env -i HOME=/root LANG=C.UTF-8 PYTHONPYCACHEPREFIX=/var/cache/gpuhost-pyc \
    PATH=/opt/gpuhost-py313/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
"""


@dataclass(frozen=True)
class Bind:
    host: Path
    inside: str  # the path in the chroot
    writable: bool = False


def chrooted(
    lower: Sequence[Path],
    argv: Sequence[str],
    binds: Sequence[Bind] = (),
    upper: Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """argv run as root chrooted into the overlay of lower (topmost first) with the checkout on
    /src (see the module docstring); writes go to upper, else to a tmpfs. Output: stdout and
    stderr together."""
    with tempfile.TemporaryDirectory(prefix="gpuhost-py313-") as top:
        specs = [f"{b.host}:{b.inside}:{'rw' if b.writable else 'ro'}" for b in binds]
        lowers = ":".join(str(p) for p in lower)
        cmd = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child"]
        cmd += ["sh", "-c", ENTER, "sh", top, lowers, str(upper or ""), str(ROOT), *specs, "--"]
        return subprocess.run(
            [*cmd, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one download or build at a time; waiters reuse it
        yield


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> str:
    """requirements.txt text: what gpuhost[dev] and gpuhost-twin need, transitively, at the
    versions the running venv has; requirements whose markers exclude 3.13 are left out, and so
    is whatever else a developer's venv holds (a package gpuhost no longer uses)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = {**default_environment(), "python_version": "3.13", "python_full_version": "3.13.0"}
    found: dict[str, str] = {}
    todo: list[tuple[str, tuple[str, ...]]] = [("gpuhost", ("dev",)), ("gpuhost-twin", ())]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = importlib.metadata.distribution(name)
        found[_norm(dist.metadata["Name"])] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not any(
                req.marker.evaluate({**env, "extra": e}) for e in ("", *extras)
            ):
                continue
            todo.append((_norm(req.name), tuple(sorted(req.extras))))
    return "".join(f"{n}=={v}\n" for n, v in sorted(found.items()) if n not in UNPINNED)


def interpreter(base: Path) -> tuple[str, str]:
    """The base python3's version and glibc version, e.g. ("3.13", "2.41")."""
    code = "import platform, sys; print('%d.%d' % sys.version_info[:2], platform.libc_ver()[1])"
    done = chrooted([base], [PYTHON, "-c", code], timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{base}{PYTHON} does not run: {done.stdout.strip()}")
    version, glibc = done.stdout.split()
    return version, glibc


def pip_platforms(glibc: str) -> list[str]:
    """The manylinux tags a glibc of this version runs (PEP 600, and the legacy aliases)."""
    major, minor = (int(p) for p in glibc.split("."))
    assert major == 2, glibc
    tags = [f"manylinux_2_{m}_x86_64" for m in range(minor, 4, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _used(target: Path) -> Path:
    os.utime(target)  # in use: _prune keeps what any checkout on this machine used lately
    return target


def _prune(root: Path, prefix: str) -> None:
    """Wheels or layers of other keys (pins or pyproject files moved on) unused for a while."""
    cutoff = time.time() - STALE_DAYS * 86400
    for old in root.glob(f"{prefix}-*"):
        if old.stat().st_mtime < cutoff:
            shutil.rmtree(old, ignore_errors=True)


def wheels(base: Path, cache: Path | None = None) -> Path:
    """The directory of binary wheels for the base's python (downloaded once per pin set)."""
    version, glibc = interpreter(base)
    root = (cache or cache_dir()) / "python313"
    text = pins() + f"{BUILD_REQUIRES}\n"
    target = root / f"wheels-{_key(text, version, glibc)}"
    if (target / "pins.txt").exists():
        return _used(target)
    with _locked(root):
        if (target / "pins.txt").exists():
            return _used(target)
        _prune(root, "wheels")
        tmp = target.with_name(target.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        (tmp / "requirements.txt").write_text(text)
        cmd = [sys.executable, "-m", "pip", "download", "--dest", str(tmp), "--only-binary=:all:"]
        cmd += ["--python-version", version, "--implementation", "cp"]
        cmd += ["--abi", f"cp{version.replace('.', '')}"]
        cmd += [arg for tag in pip_platforms(glibc) for arg in ("--platform", tag)]
        log = tmp / "pip.log"
        with log.open("w") as out:  # the machine's own pip configuration picks the index
            done = subprocess.run(
                [*cmd, "-r", str(tmp / "requirements.txt")], stdout=out, stderr=out
            )
        if done.returncode != 0:
            tail = log.read_text(errors="replace").splitlines()[-15:]
            raise RuntimeError(
                f"pip download of the cp{version} wheels failed (log {log}):\n" + "\n".join(tail)
            )
        (tmp / "pins.txt").write_text(pins())
        tmp.rename(target)
    return target


LAYER_SCRIPT = f"""set -e
export DEBIAN_FRONTEND=noninteractive UV_CACHE_DIR=/tmp/uv UV_PYTHON_DOWNLOADS=never
apt-get update -qq
apt-get install -y -qq --no-install-recommends {" ".join(TOOLS)} >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/*
uv venv -q --python {PYTHON} {VENV}
uv pip install -q --python {VENV}/bin/python --offline --no-index --find-links {WHEELS} \
    -c {WHEELS}/pins.txt -e '{SRC}[dev]' -e {SRC}/gpuhost-twin
{VENV}/bin/python -c 'import sys, gpuhost, twin; assert sys.version_info >= (3, 13), sys.version'
rm -rf /tmp/uv  # the venv holds its own links to the files
"""


def layer(base: Path, cache: Path | None = None) -> Path:
    """The overlay layer over base with the venv and TOOLS (a host directory), made once per key."""
    found = wheels(base, cache)
    parts = [found.name, base.name, LAYER_SCRIPT]
    parts += [(ROOT / p).read_text() for p in ("pyproject.toml", "gpuhost-twin/pyproject.toml")]
    target = found.parent / f"layer-{_key(*parts)}"
    if (target / "up" / VENV.lstrip("/")).is_dir():
        return _used(target) / "up"
    with _locked(found.parent):
        if (target / "up" / VENV.lstrip("/")).is_dir():
            return _used(target) / "up"
        _prune(found.parent, "layer")
        tmp = target.with_name(target.name + ".part")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "up").mkdir(parents=True)
        (tmp / "wk").mkdir()
        uv = shutil.which("uv", path=str(Path(sys.executable).parent))
        if uv is None:
            raise RuntimeError(f"no uv beside {sys.executable} (pyproject.toml depends on it)")
        binds = [Bind(found, WHEELS), Bind(Path(uv), "/usr/local/bin/uv")]
        done = chrooted([base], ["sh", "-c", LAYER_SCRIPT], binds, upper=tmp / "up")
        if done.returncode != 0:
            raise RuntimeError(
                f"making the python3.13 layer over {base} failed:\n{done.stdout[-3000:]}"
            )
        (tmp / "up/usr/local/bin/uv").unlink()  # the binds' mount points, empty
        (tmp / "up" / WHEELS.lstrip("/")).rmdir()
        shutil.rmtree(tmp / "wk")
        tmp.rename(target)
    return target / "up"


def run(
    base: Path, argv: Sequence[str], binds: Sequence[Bind] = (), timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """argv under python3.13 in the base with the layer (its venv first on PATH)."""
    top = layer(base)
    cache = top.parents[1]
    for name in ("pycache", "twin-cache"):
        (cache / name).mkdir(exist_ok=True)
    binds = [
        Bind(cache / "pycache", "/var/cache/gpuhost-pyc", writable=True),
        Bind(cache / "twin-cache", "/var/cache/gpuhost-twin", writable=True),
        *binds,
    ]
    return chrooted([top, base], argv, binds, timeout=timeout)
