"""The runtime the metrics timer runs on a host: gpuhost and what its audit imports, for the
host's own python3, made on the control machine (the host needs no package index).

Its contents: gpuhost's package and the checkout's files/ and templates/ (the planner reads
them beside the package), and the wheels of pydantic, jinja2 and packaging with their
dependencies at the versions this control machine runs, installed for the host's CPython
version (pydantic-core is compiled, so Debian 12's 3.11 and Debian 13's 3.13 need wheels of
their own): binary wheels only, by this Python's pip with this machine's pip configuration
(pip.conf, PIP_* variables), or by gpuhost's uv with its own (uv.toml, UV_*) where there is no
pip; no index is named here. pyinfra, paramiko and the rest of the control side stay out:
`python3 -m gpuhost.cli metrics --local` must not need them.

A runtime is named by its key, a hash of everything in it (gpuhost's files, the pins, the
python version), so the deploy compares the host's runtime link with the key and builds and
uploads only when they differ. Built runtimes are cached as <key>.tar.gz in
$GPUHOST_RUNTIME_CACHE (default ~/.cache/gpuhost/runtime).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import gpuhost

REQUIREMENTS = ("pydantic", "jinja2", "packaging")  # what the audit and the planner import
SITE = "site"  # the directory in a runtime that goes on PYTHONPATH
_PACKAGE = Path(gpuhost.__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent  # files/ and templates/ (the planner's Path(__file__).parents[3])
# manylinux tags a Debian 12 (glibc 2.36) or newer host runs (PEP 600 and the legacy aliases)
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(36, 16, -1)),
    "manylinux2014_x86_64",
)
UV_PLATFORM = "x86_64-manylinux_2_36"  # the same hosts, as uv names them


class RuntimeBuildError(Exception):
    """The runtime cannot be made (no pip, no wheel for the host's python)."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(python: str) -> list[str]:
    """name==version of REQUIREMENTS and their dependencies as this machine has them, for a
    host running ``python`` (markers evaluated for that version)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = {**default_environment(), "python_version": python, "python_full_version": f"{python}.0"}
    found: dict[str, str] = {}
    todo = list(REQUIREMENTS)
    while todo:
        name = _norm(todo.pop())
        if name in found:
            continue
        dist = importlib.metadata.distribution(name)
        found[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                todo.append(req.name)
    return [f"{n}=={v}" for n, v in sorted(found.items())]


def _sources() -> list[tuple[str, Path]]:
    """(path in the runtime, file here) for gpuhost's package, files/ and templates/."""
    if not (_CHECKOUT / "files").is_dir():  # the planner reads them beside the package
        raise RuntimeBuildError(
            f"no files/ beside {_PACKAGE}: the metrics runtime is made from a gpuhost checkout "
            "(run pyinfra from it, as the deploys need)"
        )
    out = []
    for top, under in (("gpuhost", _PACKAGE), ("files", _CHECKOUT / "files")):
        out += [(f"{SITE}/{top}/{p.relative_to(under)}", p) for p in sorted(under.rglob("*"))]
    templates = _CHECKOUT / "templates"
    out += [(f"{SITE}/templates/{p.relative_to(templates)}", p) for p in templates.rglob("*")]
    return sorted(
        (name, path)
        for name, path in out
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )


@functools.cache  # once per run: the files do not change under a running deploy
def runtime_key(python: str) -> str:
    """The name of the runtime for ``python``: a hash of its pins and gpuhost's files."""
    digest = hashlib.sha256(f"python {python}\n".encode())
    for pin in pins(python):
        digest.update(f"pin {pin}\n".encode())
    for name, path in _sources():
        digest.update(f"file {name}\n".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    env = os.environ.get("GPUHOST_RUNTIME_CACHE")
    return Path(env) if env else Path.home() / ".cache/gpuhost/runtime"


def install_command(
    python: str, site: Path, requirements: Path, pip: bool | None = None
) -> list[str]:
    """The install of the pinned wheels for CPython ``python`` into ``site``: this Python's
    pip where it has one (its pip.conf and PIP_* settings pick the index), else gpuhost's own
    uv (its uv.toml and UV_* settings)."""
    if pip is None:
        pip = importlib.util.find_spec("pip") is not None
    if pip:
        abi = "cp" + python.replace(".", "")
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        cmd += ["--target", str(site), "--no-deps", "--no-compile", "--only-binary=:all:"]
        cmd += ["--python-version", python, "--implementation", "cp", "--abi", abi]
        cmd += [a for tag in PLATFORMS for a in ("--platform", tag)]
        return [*cmd, "-r", str(requirements)]
    import uv  # a dependency of gpuhost (deploys/gpu_guest.py copies it into guests)

    cmd = [uv.find_uv_bin(), "pip", "install", "--quiet", "--target", str(site), "--no-deps"]
    cmd += ["--no-build", "--python-version", python, "--python-platform", UV_PLATFORM]
    return [*cmd, "-r", str(requirements)]


KEEP = 8  # cached runtimes kept (each a few MB): the ones used last, per python version


def _prune(root: Path) -> None:
    """Remove the cached runtimes beyond the KEEP used last (gpuhost's code moved on)."""
    cached = sorted(root.glob("*.tar.gz"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in cached[KEEP:]:
        old.unlink(missing_ok=True)


def build_runtime(python: str, cache: Path | None = None) -> tuple[str, Path]:
    """(key, tarball) of the runtime for ``python``, built unless cached."""
    key = runtime_key(python)
    root = cache or cache_dir()
    tarball = root / f"{key}.tar.gz"
    if tarball.is_file():
        os.utime(tarball)  # in use: pruning keeps the runtimes used last
        return key, tarball
    root.mkdir(parents=True, exist_ok=True)
    _prune(root)
    with tempfile.TemporaryDirectory(prefix="gpuhost-runtime-", dir=root) as tmp:
        site = Path(tmp) / SITE
        (Path(tmp) / "requirements.txt").write_text("".join(f"{p}\n" for p in pins(python)))
        cmd = install_command(python, site, Path(tmp) / "requirements.txt")
        done = subprocess.run(cmd, capture_output=True, text=True)  # the machine's index config
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise RuntimeBuildError(
                f"the metrics runtime for the host's python {python} needs wheels of "
                f"{', '.join(pins(python))} for CPython {python} ({' '.join(cmd[:3])}, with "
                f"this machine's own index configuration), which failed:\n{tail}"
            )
        for name, path in _sources():
            target = Path(tmp) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        (Path(tmp) / "KEY").write_text(f"{key}\n")
        part = root / f".{key}.tar.gz.part"
        with tarfile.open(part, "w:gz") as tar:
            for entry in ("KEY", SITE):
                tar.add(Path(tmp) / entry, arcname=entry)
        part.rename(tarball)
    return key, tarball
