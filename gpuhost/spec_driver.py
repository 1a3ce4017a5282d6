"""Where the NVIDIA kernel modules come from: a source tree and an artifact store, both on the
control machine (kept apart from spec.py, which holds the host's own models)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuhost.values import AbsPath


class DriverSource(BaseModel):
    """The open kernel modules' source and the store their builds are kept in."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    tree: AbsPath = Field(
        description="Absolute path, on the control machine, of an open-gpu-kernel-modules "
        "checkout whose version.mk names driver.version."
    )
    store: AbsPath = Field(
        description="Absolute path, on the control machine, of the artifact store: built modules "
        "are kept there per driver version, kernel and compiler, and installed from there "
        "without compiling again."
    )
