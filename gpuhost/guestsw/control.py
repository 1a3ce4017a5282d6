"""What the control machine contributes to a guest's software plan: its uv binary (pushed into
the guest), the CUDA repository key the spec names, and its own package index settings.

The deploy and the audit both build the guest plan from this, so both expect the same state."""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

from gpuhost.guestsw.indexconf import control_indexes
from gpuhost.guestsw.model import Control
from gpuhost.spec.guests import LxcGuest


def _uv() -> tuple[str | None, str | None]:
    try:
        import uv  # a gpuhost dependency

        path = uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        return None, None
    return path, hashlib.sha256(Path(path).read_bytes()).hexdigest()


def control_for(guest: LxcGuest) -> Control:
    uv_path, uv_sha = _uv()
    keyring, error = None, None
    if guest.cuda_repo is not None:
        try:
            keyring = Path(guest.cuda_repo.keyring).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            error = f"cannot read it on the control machine ({type(exc).__name__})"
    indexes = control_indexes()
    index_ca = None
    if indexes.cert:
        try:
            index_ca = Path(indexes.cert).read_text()
        except (OSError, UnicodeDecodeError):
            index_ca = None  # uv in the guest then trusts its own CA store
    return Control(platform.machine(), uv_path, uv_sha, keyring, error, indexes, index_ca)
