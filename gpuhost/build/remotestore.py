"""The artifact store on a build host (artifacts.build_host), as a deploy reads it.

The store stays where `gpuhost build` wrote it, on the build host. A deploy lists its manifests
there through pyinfra's connector (one command), and fetches the artifact it installs into a
mirror on the control machine (``artifacts.mirror``, an ordinary ArtifactStore), checking every
file against the sha256 the build host's manifest records: a file damaged there, or on the way,
is refused rather than installed. A mirror that already holds the artifact with the same
manifest is used as it is (verified), so a converged run fetches nothing.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from pathlib import Path

from pyinfra.api import Host

from gpuhost.build import host as buildhost
from gpuhost.build.artifacts import (
    MANIFEST,
    Artifact,
    ArtifactError,
    ArtifactKey,
    ArtifactStore,
    file_sha256,
    slug,
)
from gpuhost.spec.artifacts import ArtifactsSpec
from gpuhost.spec.inventory import build_host_data

SEPARATOR = "--gpuhost-manifest--"


class RemoteStore:
    """ArtifactStore's reading half (``keys``, ``get``) for a store on a build host."""

    def __init__(self, host: Host, path: str, mirror: str | Path) -> None:
        self.host, self.path = host, path
        self.root = f"{host.name}:{path}"  # how messages name the store
        self.mirror = ArtifactStore(Path(mirror) / slug(self.root))

    def _manifests(self, pattern: str) -> list[tuple[str, dict]]:
        """(path, manifest) of every manifest matching the shell glob ``pattern`` there."""
        out = buildhost.run(
            self.host,
            f'for m in {pattern}; do [ -f "$m" ] || continue; echo {SEPARATOR}"$m"; cat "$m"; done',
        )
        found = []
        for chunk in out.split(SEPARATOR)[1:]:
            path, _, text = chunk.partition("\n")
            try:
                record = json.loads(text)
            except json.JSONDecodeError:
                raise ArtifactError(f"{self.host.name}:{path}: not a manifest; remove it") from None
            found.append((path, record))
        return found

    def keys(self, kind: str, version: str, kernel: str) -> list[ArtifactKey]:
        """Every key stored there for (kind, version, kernel), as the manifests record them."""
        base = shlex.quote(f"{self.path}/{kind}/{version}/{kernel}")
        keys = []
        for _, record in self._manifests(f"{base}/*/{MANIFEST} {base}/*/*/{MANIFEST}"):
            key = record.get("key")
            if isinstance(key, dict) and set(key) <= set(ArtifactKey.__dataclass_fields__):
                keys.append(ArtifactKey(**key))
        return sorted(keys, key=lambda k: k.path)

    def get(self, key: ArtifactKey) -> Artifact | None:
        """The artifact under ``key`` from the build host, in the mirror and verified there;
        None when the build host has none."""
        directory = f"{self.path}/{key.path}"
        found = self._manifests(shlex.quote(f"{directory}/{MANIFEST}"))
        if not found:
            return None
        (_, record), where = found[0], f"{self.host.name}:{directory}"
        if record.get("key") != key.__dict__:
            raise ArtifactError(f"{where}/{MANIFEST}: written for another key: {record.get('key')}")
        files: dict[str, str] = record.get("files") or {}
        try:
            mirrored = self.mirror.get(key)
        except ArtifactError:
            mirrored = None  # damaged in the mirror: fetched again below
        if mirrored is not None and mirrored.files == files:
            return mirrored
        return self._fetch(key, directory, files, record.get("meta") or {})

    def _fetch(self, key: ArtifactKey, directory: str, files: dict[str, str], meta: dict):
        self.mirror.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=self.mirror.root))
        try:
            for name, digest in sorted(files.items()):
                local = staging / name
                if not self.host.get_file(f"{directory}/{name}", str(local)):
                    raise ArtifactError(f"{self.host.name}:{directory}/{name}: could not fetch it")
                if file_sha256(local) != digest:
                    raise ArtifactError(
                        f"{self.host.name}:{directory}/{name}: its sha256 is not the one the "
                        f"manifest records ({digest}): it changed on the build host or on the "
                        f"way. Remove {directory} there and build again (`gpuhost build`)"
                    )
            return self.mirror.put(key, [staging / n for n in sorted(files)], meta)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


_CONNECTIONS: dict[tuple[str, str], Host] = {}  # (inventory file, build host): one per run


def store_for(artifacts: ArtifactsSpec, source: str) -> ArtifactStore | RemoteStore:
    """The store a deploy reads: the control machine's directory, or the store on the build host
    that inventory file ``source`` declares, connected on first use (a converged run, which
    installs nothing, never connects)."""
    if artifacts.build_host is None:
        return ArtifactStore(artifacts.store)
    name = artifacts.build_host
    if (source, name) not in _CONNECTIONS:
        _CONNECTIONS[source, name] = buildhost.connect(name, build_host_data(source, name))
    return RemoteStore(_CONNECTIONS[source, name], artifacts.store, artifacts.mirror)
