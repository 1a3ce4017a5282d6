"""The control fields of a Debian package, read on the control machine without dpkg.

A .deb is an ar archive: `debian-binary`, then `control.tar[.gz|.xz|.zst]`, then the data
(deb(5)). gpuhost reads its `control` file to check a package is what the spec says before
anything is uploaded: a file name can lie. zstd-compressed control members (Ubuntu's default
since 21.10) need the `zstd` tool; gz, xz and uncompressed ones are read with the standard
library.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path


class DebError(ValueError):
    """Not a Debian package gpuhost can read; the message names the file and why."""


def _members(data: bytes, path: Path) -> dict[str, bytes]:
    if not data.startswith(b"!<arch>\n"):
        raise DebError(f"{path}: not a Debian package (no ar archive header)")
    members, at = {}, 8
    while at + 60 <= len(data):
        header = data[at : at + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise DebError(f"{path}: a damaged ar member header at byte {at}") from None
        members[name] = data[at + 60 : at + 60 + size]
        at += 60 + size + (size % 2)  # members are 2-byte aligned
    return members


def control_fields(path: Path) -> dict[str, str]:
    """The package's control fields (Package, Version, Architecture, ...)."""
    path = Path(path)
    members = _members(path.read_bytes(), path)
    name = next((n for n in members if n.startswith("control.tar")), None)
    if name is None:
        raise DebError(f"{path}: no control.tar member; not a Debian binary package")
    blob = _unzstd(members[name], name, path)
    try:
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            member = next(m for m in tar.getmembers() if m.name.lstrip("./") == "control")
            extracted = tar.extractfile(member)
            text = extracted.read().decode("utf-8", "replace") if extracted else ""
    except (tarfile.TarError, StopIteration):
        raise DebError(f"{path}: {name} holds no readable control file") from None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if line[:1] not in (" ", "\t") and ":" in line:
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def _unzstd(blob: bytes, name: str, path: Path) -> bytes:
    """tarfile reads gz, bz2 and xz itself; zstd needs the tool."""
    if not name.endswith(".zst"):
        return blob
    try:
        return subprocess.run(["zstd", "-dc"], input=blob, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise DebError(f"{path}: its {name} needs the zstd tool: {exc}") from None


def data_tar(path: Path) -> tarfile.TarFile:
    """The package's file system tree (its data.tar member), opened for reading."""
    path = Path(path)
    members = _members(path.read_bytes(), path)
    name = next((n for n in members if n.startswith("data.tar")), None)
    if name is None:
        raise DebError(f"{path}: no data.tar member; not a Debian binary package")
    try:
        return tarfile.open(fileobj=io.BytesIO(_unzstd(members[name], name, path)))
    except tarfile.TarError as exc:
        raise DebError(f"{path}: {name} cannot be read: {exc}") from None
