"""Copy the twin's own Python packages into a root (/usr/lib/gpuhost-twin) with their bytecode.

Every shim run imports them: without bytecode beside the copy, its first run in each root (and
every run where PYTHONDONTWRITEBYTECODE is set, as in some test environments) compiles them
again, about half the CPU time of a short shim call. The .pyc files are checked-hash ones (PEP
552): valid while the copy's text is unchanged, whatever its path or mtime, recompiled by Python
when a test edits the copy; a Python of another version looks for its own cache tag and
ignores them. Each source is compiled once per process.
"""

from __future__ import annotations

import py_compile
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_compiled: dict[Path, tuple[bytes, bytes]] = {}  # source -> (its text, its .pyc)


def copy_package(
    package: Path, dest: Path, copy: Callable[[Path, Path], object] = shutil.copy2
) -> None:
    """Copy package's *.py files into dest, each with its .pyc in dest/__pycache__."""
    dest.mkdir(parents=True, exist_ok=True)
    tag = sys.implementation.cache_tag
    if tag is not None:
        (dest / "__pycache__").mkdir(exist_ok=True)
    for source in package.glob("*.py"):
        copy(source, dest / source.name)
        if tag is not None:  # the path importlib reads, whatever this process's pycache prefix
            (dest / "__pycache__" / f"{source.stem}.{tag}.pyc").write_bytes(_pyc(source))


def _pyc(source: Path) -> bytes:
    text = source.read_bytes()
    known = _compiled.get(source)
    if known is None or known[0] != text:
        with tempfile.TemporaryDirectory(prefix="gpuhost-twin-pyc-") as tmp:
            out = Path(tmp) / "module.pyc"
            py_compile.compile(
                str(source),
                cfile=str(out),
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
            known = (text, out.read_bytes())
        _compiled[source] = known
    return known[1]
