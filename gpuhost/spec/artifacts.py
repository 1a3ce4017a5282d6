"""Where built artifacts live (spec field `artifacts`): a store directory, and the machine that
builds. Kept apart from spec.py so the host spec stays one readable file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuhost.spec.values import AbsPath, Hostname

# An explicit, machine-wide default: not under a home directory, so root's and an operator's
# runs of `gpuhost build` find the same store.
DEFAULT_STORE = "/var/cache/gpuhost/artifacts"
DEFAULT_MIRROR = "/var/cache/gpuhost/mirror"


class ArtifactsSpec(BaseModel):
    """The kernel artifact store: the .debs `gpuhost build` made, keyed by release, compiler and
    config hash, on the control machine or a build host. (NVIDIA modules have their own store
    on the control machine, driver.source.store.)"""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    store: AbsPath = Field(
        DEFAULT_STORE,
        description="Absolute path of the store on the machine that builds (the control machine "
        "unless build_host is set).",
    )
    build_host: Hostname | None = Field(
        None,
        description="Build on this host over SSH, into `store` there; deploys take the kernel "
        "from that store. It names a host the inventory declares with "
        "`gpuhost.spec.inventory.build_host(name, ssh_hostname=...)`. None builds on the control "
        "machine.",
    )
    mirror: AbsPath = Field(
        DEFAULT_MIRROR,
        description="With build_host: where the control machine keeps verified copies of what "
        "deploys took from the build host's store (one directory per build host and store).",
    )
