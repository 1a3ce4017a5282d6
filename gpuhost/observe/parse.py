"""Helpers shared by the probes' parsers: loud failures and exit-status framing."""

from __future__ import annotations

# Appended to commands whose failure is a state worth reporting (no driver loaded, no
# proxmox-boot-tool configuration) rather than an error that should fail the host.
STATUS_MARK = "#gpuhost-exit="


class UnparsedOutput(ValueError):
    """Output a parser does not understand. Parsers never guess: they name the line."""

    def __init__(self, what: str, line: str, why: str = "unexpected line") -> None:
        super().__init__(f"{what}: {why}: {line!r}")
        self.line = line


def with_status(command: str) -> str:
    """Run ``command`` with stderr folded into stdout and its exit status as a last line."""
    return f'{command} 2>&1; echo "{STATUS_MARK}$?"'


def split_status(lines: list[str], what: str) -> tuple[list[str], int]:
    """Split the output of a :func:`with_status` command into (lines, exit status)."""
    if not lines or not lines[-1].startswith(STATUS_MARK):
        raise UnparsedOutput(what, lines[-1] if lines else "", "missing exit status line")
    return lines[:-1], int(lines[-1].removeprefix(STATUS_MARK))


def strip_ansi(line: str) -> str:
    """nvidia-smi underlines table headers with ANSI escapes even when not on a terminal."""
    return line.replace("\x1b[4m", "").replace("\x1b[0m", "")


def normalize_bdf(address: str) -> str:
    """'00000000:41:00.0' (nvidia-smi) or '41:00.0' -> '0000:41:00.0' (sysfs form)."""
    address = address.strip().lower()
    parts = address.split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    if len(parts) != 3:
        raise ValueError(f"not a PCI address: {address!r}")
    domain, bus, devfn = parts
    return f"{int(domain, 16):04x}:{bus}:{devfn}"
