"""What every twin Proxmox tool shares and that costs no import: where the twin keeps its own
bookkeeping, and the parse warnings of guest configs (config.py collects them; the tools print
them as perl prints its warnings). The boot tools (proxmox-boot-tool, update-grub) need no more
than this of config.py, whose guest-config machinery they would otherwise import on every run."""

from __future__ import annotations

TWIN_STATE = "var/lib/gpuhost-twin"  # the twin's own bookkeeping, relative to root

WARNINGS: list[str] = []


def drain_warnings() -> list[str]:
    """Parse warnings since the last call, each once, in order."""
    found = list(dict.fromkeys(WARNINGS))
    WARNINGS.clear()
    return found
