"""The artifact store: built kernels and NVIDIA modules, kept so a rebuilt host needs no compiler.

A store is a directory (on the control machine, or a path on a build host reached the same
way). Each artifact lives under a key that names everything its bytes depend on: what it is,
its version, the kernel it was built for and the exact compiler string (and, for kernels, the
hash of the config). A manifest records each file's sha256; reading an artifact verifies them,
so a truncated copy or a file changed by hand is refused rather than installed. Writes are
atomic: a half-written artifact is never visible under its key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

MANIFEST = "manifest.json"
_SLUG = re.compile(r"[^A-Za-z0-9.+_-]+")


class ArtifactError(RuntimeError):
    """A stored artifact is damaged or incomplete."""


def slug(text: str) -> str:
    """A path component from free text (a compiler string): stable, readable, no separators."""
    cleaned = _SLUG.sub("_", text.strip()).strip("_.")
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{cleaned[:60]}-{digest}"


@dataclass(frozen=True)
class ArtifactKey:
    kind: str  # "nvidia-modules" | "kernel"
    version: str  # driver version, or kernel release
    kernel: str  # the kernel release it was built for (for a kernel: itself)
    compiler: str  # exact compiler string: "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"
    config: str = ""  # hash of the kernel config, for kernels

    @property
    def path(self) -> Path:
        parts = [self.kind, self.version, self.kernel, slug(self.compiler)]
        if self.config:
            parts.append(self.config)
        return Path(*parts)


@dataclass(frozen=True)
class Artifact:
    key: ArtifactKey
    directory: Path
    files: dict[str, str]  # file name -> sha256
    meta: dict = field(default_factory=dict)  # what the builder recorded (vermagic, compiler)

    def file(self, name: str) -> Path:
        return self.directory / name


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class StoreReader(Protocol):
    """What installing from a store reads: ArtifactStore, or a build host's (remotestore.py)."""

    root: object  # a Path, or "host:/path": how messages name the store

    def keys(self, kind: str, version: str, kernel: str) -> list[ArtifactKey]: ...

    def get(self, key: ArtifactKey) -> Artifact | None: ...


class ArtifactStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def get(self, key: ArtifactKey) -> Artifact | None:
        """The artifact under ``key``, verified file by file; None when there is none."""
        directory = self.root / key.path
        manifest = directory / MANIFEST
        if not manifest.is_file():
            return None
        record = json.loads(manifest.read_text())
        if record.get("key") != key.__dict__:
            raise ArtifactError(f"{manifest}: written for another key: {record.get('key')}")
        files: dict[str, str] = record["files"]
        for name, digest in files.items():
            path = directory / name
            if not path.is_file() or file_sha256(path) != digest:
                raise ArtifactError(
                    f"{path}: missing or changed since it was stored (sha256 {digest}); "
                    f"remove {directory} and build again"
                )
        return Artifact(key, directory, files, record.get("meta", {}))

    def keys(self, kind: str, version: str, kernel: str) -> list[ArtifactKey]:
        """Every key stored for (kind, version, kernel), whatever its compiler and config, as
        the manifests record them (unverified: :meth:`get` checks the files)."""
        base = self.root / kind / version / kernel
        found = []
        for manifest in sorted(base.glob(f"*/{MANIFEST}")) + sorted(base.glob(f"*/*/{MANIFEST}")):
            key = json.loads(manifest.read_text()).get("key")
            if isinstance(key, dict) and set(key) <= set(ArtifactKey.__dataclass_fields__):
                found.append(ArtifactKey(**key))
        return found

    def put(self, key: ArtifactKey, files: list[Path], meta: dict | None = None) -> Artifact:
        """Store ``files`` under ``key`` (replacing what was there), atomically."""
        target = self.root / key.path
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".incoming-", dir=target.parent))
        try:
            digests = {}
            for src in files:
                shutil.copy2(src, staging / src.name)
                digests[src.name] = file_sha256(staging / src.name)
            record = {"key": key.__dict__, "files": digests, "meta": meta or {}}
            (staging / MANIFEST).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            old = None
            if target.exists():
                old = target.with_name(f".old-{target.name}-{os.getpid()}")
                target.rename(old)
            staging.rename(target)
            if old is not None:
                shutil.rmtree(old)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        return Artifact(key, target, digests, meta or {})
