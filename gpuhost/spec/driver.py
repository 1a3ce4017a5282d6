"""Where the NVIDIA driver comes from, on the control machine: the open kernel modules' source
tree and the artifact store their builds are kept in, NVIDIA's installer for the userspace and
GSP firmware, and the fabric manager package (kept apart from spec.py, the host's own models)."""

from __future__ import annotations

import posixpath
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuhost.spec.values import AbsPath

# NVIDIA's file names: the .run carries the driver version, the fabric manager .deb its package
# name (`nvidia-fabricmanager-<branch>` up to R575, `nvidia-fabricmanager` later), the version
# and Debian revision ("nvidia-fabricmanager-570_570.124.06-1_amd64.deb").
INSTALLER_NAME = re.compile(r"NVIDIA-Linux-x86_64-(?P<version>\d+\.\d+(?:\.\d+)?)\.run")
FABRICMANAGER_NAME = re.compile(
    r"nvidia-fabricmanager(?:-(?P<branch>\d+))?_(?P<version>\d+\.\d+(?:\.\d+)?)-[0-9A-Za-z.+~]+"
    r"_amd64\.deb"
)


def installer_name(version: str) -> str:
    return f"NVIDIA-Linux-x86_64-{version}.run"


class DriverSource(BaseModel):
    """The open kernel modules' source and the store their builds are kept in; optionally the
    installer of the driver's userspace and the fabric manager package."""

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
    installer: AbsPath | None = Field(
        None,
        description="Absolute path, on the control machine, of NVIDIA's "
        "`NVIDIA-Linux-x86_64-<driver.version>.run`: run on the host with --no-kernel-modules "
        "for the userspace (libcuda, NVML, nvidia-smi, nvidia-persistenced) and the GSP "
        "firmware of exactly driver.version. None: the userspace is not managed.",
    )
    fabricmanager: AbsPath | None = Field(
        None,
        description="Absolute path, on the control machine, of the `nvidia-fabricmanager` .deb "
        "of driver.version (`nvidia-fabricmanager[-<branch>]_<driver.version>-<rev>_amd64.deb`;"
        " NVIDIA's repository adds the branch up to R575). Its name and its own control fields "
        "(Package, Version) must say that version. Required with `installer` where NVSwitches "
        "are on the PCI bus; unused elsewhere.",
    )

    @field_validator("installer")
    @classmethod
    def _installer_name(cls, value: str | None) -> str | None:
        if value is not None and not INSTALLER_NAME.fullmatch(posixpath.basename(value)):
            raise ValueError(
                f"{posixpath.basename(value)!r} is not an NVIDIA installer's name; point it at "
                "the driver's NVIDIA-Linux-x86_64-<version>.run, e.g. "
                "'/srv/nvidia/NVIDIA-Linux-x86_64-595.71.05.run'"
            )
        return value

    @field_validator("fabricmanager")
    @classmethod
    def _fabricmanager_name(cls, value: str | None) -> str | None:
        if value is not None and not FABRICMANAGER_NAME.fullmatch(posixpath.basename(value)):
            raise ValueError(
                f"{posixpath.basename(value)!r} is not a fabric manager package's name; point it "
                "at the .deb of the driver's version, e.g. "
                "'/srv/nvidia/nvidia-fabricmanager_595.71.05-1_amd64.deb'"
            )
        return value


def version_problems(driver: object) -> list[tuple[str, str, str]]:
    """(field, value, message) for each NVIDIA file in the raw ``driver`` section whose name
    contradicts driver.version: every part must be of exactly that version."""
    if not isinstance(driver, dict) or not isinstance(driver.get("source"), dict):
        return []
    version, source = driver.get("version"), driver["source"]
    if not isinstance(version, str):
        return []
    problems = []
    installer, fabric = source.get("installer"), source.get("fabricmanager")
    named = (
        INSTALLER_NAME.fullmatch(posixpath.basename(installer))
        if isinstance(installer, str)
        else None
    )
    if named and named["version"] != version:
        problems.append(
            (
                "installer",
                installer,
                f"it installs driver {named['version']}, but driver.version is {version}; point "
                f"it at {installer_name(version)} (the userspace must equal the kernel driver)",
            )
        )
    named = (
        FABRICMANAGER_NAME.fullmatch(posixpath.basename(fabric))
        if isinstance(fabric, str)
        else None
    )
    if named and (
        named["version"] != version or named["branch"] not in (None, version.split(".")[0])
    ):
        problems.append(
            (
                "fabricmanager",
                fabric,
                f"it is fabric manager {named['version']}, but driver.version is {version}; use "
                f"the nvidia-fabricmanager package of {version}",
            )
        )
    return problems
