"""Several facts in one round trip.

A converged re-run must cost about one SSH command, not one per fact: :class:`Combined` runs the
commands of many facts in one shell, framed by markers, and returns each one's raw output and
exit status for the facts' own parsers.
"""

from __future__ import annotations

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe

KEY_MARK = "#gpuhost-fact="
RC_MARK = "#gpuhost-rc="
MISSING_TOOL = 127  # exit status recorded when a fact's required tool is absent


def framed(command: str, tool: str | None) -> str:
    """``command`` guarded like pyinfra's ``requires_command``, ending with its exit status."""
    if tool:
        return (
            f"if command -v {tool} >/dev/null 2>&1; then ( {command} ); rc=$?; "
            f'else rc={MISSING_TOOL}; fi; echo "{RC_MARK}$rc"'
        )
    return f'( {command} ); echo "{RC_MARK}$?"'


def split_combined(lines: list[str]) -> dict[str, tuple[int, list[str]]]:
    raw: dict[str, tuple[int, list[str]]] = {}
    key: str | None = None
    chunk: list[str] = []
    for line in lines:
        if line.startswith(KEY_MARK):
            key, chunk = line.removeprefix(KEY_MARK), []
        elif line.startswith(RC_MARK) and key is not None:
            raw[key] = (int(line.removeprefix(RC_MARK)), chunk)
            key = None
        elif key is not None:
            chunk.append(line)
        else:
            raise UnparsedOutput("combined facts", line, "line outside any fact")
    if key is not None:
        raise UnparsedOutput("combined facts", key, "fact output ended without an exit status")
    return raw


class Commands(tuple[tuple[str, str, str | None], ...]):
    """The ``(key, command, required tool)`` triples a :class:`Combined` runs, shown by their keys:
    pyinfra prints a fact's arguments in its log ("Connected (to load fact ...)"), and the commands
    themselves run to thousands of characters."""

    def __repr__(self) -> str:
        keys = [key for key, _, _ in self]
        more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
        return f"{len(keys)} facts: {', '.join(keys[:3])}{more}"

    __str__ = __repr__


class Combined(Probe[dict[str, tuple[int, list[str]]]]):
    """
    Runs ``(key, command, required tool)`` triples in one shell; returns key -> (exit status,
    stdout lines). Exit status 127 means the required tool is absent.
    """

    default = dict

    def command(self, commands: tuple[tuple[str, str, str | None], ...]) -> str:
        # The facts run side by side (nvidia-smi and proxmox-boot-tool take a while each on a
        # real host), each into its own file, printed in order once all have finished.
        runs = " ".join(
            f'{{ echo "{KEY_MARK}{key}"; {framed(cmd, tool)}; }} >"$d/{i}" &'
            for i, (key, cmd, tool) in enumerate(commands)
        )
        files = " ".join(f'"$d/{i}"' for i in range(len(commands)))
        return (
            'd=$(mktemp -d "${TMPDIR:-/tmp}/gpuhost-facts.XXXXXX") || exit 1; '
            f'{runs} wait; cat {files}; rm -rf "$d"'
        )

    def process(self, output: list[str]) -> dict[str, tuple[int, list[str]]]:
        return split_combined(output)
