"""What a host had before the rehearsed deploy: a profile's ``start`` section.

Hand-written profiles describe hardware and a factory install only; a profile made from a real
capture (``gpuhost rehearse``, twin/fromcapture.py) also carries the host's software as it was
read, so that the deploy rehearsed on the twin starts where it would start on the host: the boot
loader's files as they are, the modprobe.d and modules-load.d files, the driver that was loaded,
the guests and whether they ran, the Proxmox packages. A twin with a ``start`` gets all of it
before its first boot (and the driver, which needs a booted kernel, right after).

``assumed`` lists, in words, what the capture could not know and the profile took instead (a
firmware quirk, a GPU field no fact reads); ``source`` says which capture the profile came from.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_PATH = re.compile(r"^/(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9._@+:/-]+$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DriverStart(_Model):
    """The NVIDIA driver the host had installed and loaded when it was captured."""

    version: str = Field(pattern=r"^\d+\.\d+(\.\d+)?$")
    open: bool = True  # the open kernel module (NvidiaDriver: "Open Kernel Module")
    # modules loaded at capture (LoadedModules), e.g. nvidia, nvidia_uvm; None: not captured
    loaded: list[str] | None = None


class GuestStart(_Model):
    """A guest as Proxmox held it: its config file exactly as read, and whether it ran."""

    kind: Literal["lxc", "qemu"]
    vmid: int = Field(ge=100, le=999_999_999)
    config: str  # /etc/pve/{lxc,qemu-server}/<vmid>.conf as captured (secrets redacted)
    running: bool = False


class HostStart(_Model):
    """The captured host's software, set into a new twin before its first boot."""

    # Files as read (path -> text), e.g. /etc/kernel/cmdline, /etc/default/grub and its drop-ins,
    # /etc/modprobe.d/*.conf, /etc/modules-load.d/*.conf, gpuhost's own files; and symlinks
    # (path -> target). Never anything secret: twin/fromcapture.py leaves those out.
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    # Glob patterns the capture read in full (a fact's paths, e.g. /etc/modprobe.d/*.conf): what
    # the twin has there beyond files and links is removed (the boot loader's own files stay).
    exact: list[str] = []
    running_kernel: str | None = None  # the kernel that ran (one of the profile's kernels)
    # /proc/cmdline as captured: what the loader's entries hand the kernel until its next
    # refresh (None: what the captured boot files make)
    cmdline: str | None = None
    driver: DriverStart | None = None  # None: no NVIDIA driver loaded at capture
    guests: list[GuestStart] = []
    # Debian package -> version as dpkg had it (pve-manager, pve-container, qemu-server): the
    # twin registers exactly these ({}: the host had no Proxmox); None: not captured, the
    # profile's Proxmox release's own (twin/pve/setup.py RELEASE_PACKAGES)
    packages: dict[str, str] | None = None
    os_release: dict[str, str] = {}  # /etc/os-release ID, VERSION_ID, VERSION_CODENAME

    @field_validator("files", "links", "exact")
    @classmethod
    def _paths(cls, value: dict[str, str] | list[str]) -> dict[str, str] | list[str]:
        for path in value:
            if not _PATH.match(path.replace("*", "x").replace("?", "x")):
                raise ValueError(f"{path!r} is not an absolute path without '..'")
        return value
