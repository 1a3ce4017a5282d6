"""What every simulated hardware tool shares: the machine (hwsim) under $TWIN_ROOT, output."""

from __future__ import annotations

import os
import sys
from pathlib import Path

try:  # inside the twin the hwsim package sits next to this one (/usr/lib/gpuhost-twin)
    import hwsim  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - the repository layout
    from twin import hwsim

__all__ = ["err", "hwsim", "load_hw", "out", "root"]


def out(text: str) -> None:
    sys.stdout.write(text)


def err(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


def root() -> Path:
    return Path(os.environ.get("TWIN_ROOT", "/"))


def load_hw() -> hwsim.Hw | None:
    try:
        return hwsim.Hw(root())
    except FileNotFoundError:
        return None
