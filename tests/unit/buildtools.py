"""What a real NVIDIA module build on this machine needs, for honest skip messages."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpuhost.build.driver import modinfo

# The stand-in NVIDIA tree and this machine's Debian kernel headers (their build directories).
DRIVER_TREE = Path(__file__).parents[1] / "fixtures/driver-src/open-gpu-kernel-modules"
HEADERS = sorted(Path("/usr/src").glob("linux-headers-*-amd64"))


def missing_module_build(headers: list[Path]) -> str | None:
    """Why the real module build against ``headers`` (the test's kernel build directories)
    cannot run here, naming only what is absent; None when it can."""
    absent = [
        what
        for what, present in (
            ("Debian kernel headers (linux-headers-amd64)", bool(headers)),
            ("gcc-12", shutil.which("gcc-12") is not None),
            ("modinfo (kmod)", modinfo() is not None),
        )
        if not present
    ]
    return f"needs {', '.join(absent)}: ./gpuhost-setup installs them" if absent else None
