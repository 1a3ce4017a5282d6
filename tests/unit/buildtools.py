"""What a real NVIDIA module build on this machine needs, for honest skip messages."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpuhost.driverbuild import modinfo


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
