"""GRUB's environment block (stdlib only): the 1024-byte file grub-editenv and load_env/save_env
read and write ("# GRUB Environment Block" header, name=value lines, '#' padding)."""

from __future__ import annotations

import os
from pathlib import Path

HEADER = "# GRUB Environment Block\n"
SIZE = 1024


def read(path: Path) -> dict[str, str]:
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        values[name] = value
    return values


def write(path: Path, values: dict[str, str]) -> None:
    body = HEADER + "".join(f"{k}={v}\n" for k, v in values.items())
    if len(body) > SIZE:
        raise ValueError("environment block too small")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes((body + "#" * (SIZE - len(body))).encode())
    os.replace(tmp, path)


def ensure(path: Path) -> None:
    """grub-install creates an empty block when there is none."""
    if not Path(path).exists():
        write(path, {})
