"""Where built artifacts live (spec field `artifacts`): a store directory, and the machine that
builds. Kept apart from spec.py so the host spec stays one readable file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuhost.values import AbsPath, Hostname

# An explicit, machine-wide default: not under a home directory, so root's and an operator's
# runs of `gpuhost build` find the same store.
DEFAULT_STORE = "/var/cache/gpuhost/artifacts"


class ArtifactsSpec(BaseModel):
    """The artifact store: kernels (.debs) and NVIDIA modules, keyed by version, kernel,
    compiler and config hash."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    store: AbsPath = Field(
        DEFAULT_STORE,
        description="Absolute path of the store on the machine that builds (the control machine "
        "unless build_host is set).",
    )
    build_host: Hostname | None = Field(
        None,
        description="Build on this host over SSH, into `store` there. Not applied yet: "
        "`gpuhost build` refuses it; None builds on the control machine.",
    )
