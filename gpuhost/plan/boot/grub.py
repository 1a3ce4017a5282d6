"""The kernel command line that GRUB's config files set, read as people write them. Pure.

Debian's grub-mkconfig (run by update-grub) sources ``/etc/default/grub`` and then every
``/etc/default/grub.d/*.cfg`` in glob (sorted) order, as sh scripts: the last assignment of a
variable wins, and a drop-in can append with ``VAR="$VAR more"`` (Proxmox's installer writes
grub.d/installer.cfg and grub.d/zfs.cfg exactly so). /etc/grub.d/10_linux then puts
``GRUB_CMDLINE_LINUX GRUB_CMDLINE_LINUX_DEFAULT`` on every normal entry and only
``GRUB_CMDLINE_LINUX`` on the recovery entries.

gpuhost never edits /etc/default/grub: it owns one drop-in (:data:`DROPIN`) that appends its
parameters to GRUB_CMDLINE_LINUX, so they reach the recovery entries too (an IOMMU setting that
differs between normal and recovery boots changes IOMMU groups and driver binding under the
operator's feet).

The reader evaluates statically what is safe to evaluate: comments (whole-line and after a
value), single, double and no quotes, quote concatenation, ``export``, several assignments
(last wins, ``;`` between them), backslash-newline continuations, references to
GRUB_CMDLINE_LINUX / GRUB_CMDLINE_LINUX_DEFAULT themselves, and ``if [ ... ]; then ... fi``
blocks that set other variables (a condition that is not a variable-setting builtin runs in a
child process and cannot change one). Anything
else that could change these two variables (command substitution, other variables, commands,
setting them inside an ``if``) is an error that names the file and line and says what to write
instead: gpuhost does not guess what a shell script would do.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULTS = "/etc/default/grub"
DROPIN_DIR = "/etc/default/grub.d"
# Sorted after the drop-ins Proxmox writes (installer.cfg, proxmox-kernel-pin.cfg, zfs.cfg), so
# no stock drop-in is sourced after gpuhost's and could reassign the variable without it.
DROPIN = f"{DROPIN_DIR}/zz-gpuhost.cfg"

LINUX = "GRUB_CMDLINE_LINUX"
LINUX_DEFAULT = "GRUB_CMDLINE_LINUX_DEFAULT"
VARIABLES = (LINUX, LINUX_DEFAULT)

# Placeholders the scanner puts where the shell would expand something; NUL never occurs in a
# shell script, so they cannot collide with text.
_REF = {LINUX: "\0L\0", LINUX_DEFAULT: "\0D\0"}
_SUBST = "\0S\0"  # command substitution
_OTHER = "\0X\0"  # expansion of any other variable or parameter
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Shell builtins that change the sourcing shell's variables (POSIX special and regular builtins,
# bash's too); any other command in an if's condition runs in a child process and cannot.
_SETS_VARIABLES = frozenset(
    ". source eval read export readonly set unset local declare typeset getopts mapfile "
    "readarray printf let exec command builtin trap alias".split()
)
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
_OPERATORS = set(";&|<>()")


# The way forward when a line cannot be read: what gpuhost does read.
READABLE = (
    "gpuhost reads plain assignments (literal values and $GRUB_CMDLINE_LINUX / "
    "$GRUB_CMDLINE_LINUX_DEFAULT references, several on a line with ';') and `if <test>; then "
    "... fi` blocks that set other GRUB variables, and won't guess what the shell would do with "
    "anything else"
)
COMMAND_FIX = (
    "write what it sets as plain assignments instead (kernel parameters as literal "
    "GRUB_CMDLINE_LINUX=... values; a drop-in /etc/default/grub.d/<name>.cfg of such lines works "
    f"too, update-grub sources those), then run gpuhost again; gpuhost itself only writes {DROPIN}"
)
CONDITIONAL_FIX = (
    "set it outside the block, unconditionally (keep the block for the other settings), then run "
    "gpuhost again: gpuhost must know the command line the next boot gets"
)


class GrubConfigError(ValueError):
    """A line gpuhost cannot evaluate statically; names the file and line, and what to do."""

    def __init__(self, origin: str, why: str, fix: str = COMMAND_FIX) -> None:
        super().__init__(f"{origin}: {why}; {READABLE}: {fix}")
        self.origin = origin


@dataclass(frozen=True)
class Param:
    value: str  # intel_iommu=on
    variable: str  # GRUB_CMDLINE_LINUX | GRUB_CMDLINE_LINUX_DEFAULT
    origin: str  # /etc/default/grub:9 (the line that put it there)


@dataclass(frozen=True)
class GrubCmdline:
    """The effective values of both variables after sourcing every file, per parameter."""

    linux: tuple[Param, ...] = ()
    linux_default: tuple[Param, ...] = ()

    @property
    def normal(self) -> tuple[Param, ...]:
        """Parameters of a normal boot entry, in 10_linux's order."""
        return self.linux + self.linux_default

    @property
    def recovery(self) -> tuple[Param, ...]:
        return self.linux

    def values(self, variable: str) -> list[str]:
        return [p.value for p in (self.linux if variable == LINUX else self.linux_default)]

    def from_dropin(self) -> list[str]:
        """The parameters gpuhost's own drop-in contributes (read back from the file)."""
        return [p.value for p in self.normal if p.origin.rpartition(":")[0] == DROPIN]


def sourced_files(paths: list[str]) -> list[str]:
    """The files among ``paths`` that grub-mkconfig sources, in its order.

    /etc/default/grub first, then /etc/default/grub.d/*.cfg sorted (the shell glob; hidden
    files do not match ``*``). Other paths are not sourced.
    """
    dropins = sorted(
        p
        for p in paths
        if p.startswith(f"{DROPIN_DIR}/")
        and "/" not in p.removeprefix(f"{DROPIN_DIR}/")
        and p.endswith(".cfg")
        and not p.removeprefix(f"{DROPIN_DIR}/").startswith(".")
    )
    return ([DEFAULTS] if DEFAULTS in paths else []) + dropins


def parse_grub_defaults(files: Mapping[str, str]) -> GrubCmdline:
    """Evaluate GRUB_CMDLINE_LINUX(_DEFAULT) over ``files`` (path -> content) like update-grub."""
    state: dict[str, tuple[Param, ...]] = {LINUX: (), LINUX_DEFAULT: ()}
    for path in sourced_files(list(files)):
        blocks: list[str] = []  # origins of the open `if` blocks
        for line, text, problems in _statements(path, files[path]):
            _apply(f"{path}:{line}", text, problems, state, blocks)
        if blocks:
            raise GrubConfigError(blocks[-1], "this if block has no fi", "close it with fi")
    return GrubCmdline(linux=state[LINUX], linux_default=state[LINUX_DEFAULT])


def render_dropin(params: list[str]) -> str:
    """gpuhost's drop-in: appends ``params`` to GRUB_CMDLINE_LINUX, one line per parameter.

    ``params`` have passed the spec's strict grammar (no quotes, $, backticks, backslashes or
    whitespace); shlex.quote still quotes any that a shell would otherwise interpret (``*``,
    ``;``...), outside the double-quoted reference so the quoting is the shell's own.
    """
    for param in params:
        if not param or any(c in param for c in "\"'$`\\") or any(c.isspace() for c in param):
            raise ValueError(f"not a plain kernel parameter: {param!r}")
    lines = [
        "# Managed by gpuhost: the kernel parameters it plans for this host. Sourced by",
        "# update-grub after /etc/default/grub; they go on normal and recovery entries alike.",
        "# Do not edit: change the host's spec instead (this file is rewritten).",
    ]
    lines += [f'{LINUX}="${{{LINUX}}} "{shlex.quote(p)}' for p in params]
    return "\n".join(lines) + "\n"


# --- the scanner: statements with expansions replaced by placeholders ------------------------


def _statements(path: str, content: str) -> list[tuple[int, str, list[str]]]:
    """Split ``content`` into (first line, sanitised text, problems) per statement.

    Sanitised text is still shell text (quotes kept, for shlex), with comments removed,
    continuations joined and every expansion replaced by a placeholder; problems say what a
    placeholder or operator stands for, for the error message.
    """
    statements: list[tuple[int, str, list[str]]] = []
    out: list[str] = []
    problems: list[str] = []
    line = start = 1
    i, n = 0, len(content)
    quote: str | None = None

    def end_statement() -> None:
        nonlocal out, problems
        text = "".join(out).strip()
        if text:
            statements.append((start, text, problems))
        out, problems = [], []

    while i < n:
        c = content[i]
        if quote == "'":
            out.append(c)
            line += c == "\n"
            quote = None if c == "'" else quote
            i += 1
            continue
        if c == "\\" and i + 1 < n:
            if content[i + 1] == "\n":  # continuation: the shell drops both characters
                line += 1
            else:
                out.append(content[i : i + 2])
            i += 2
            continue
        if c == "$":
            i = _dollar(content, i, out, problems)
            continue
        if c == "`":
            close = _closing_backtick(content, i)
            if close is None:
                raise GrubConfigError(f"{path}:{line}", "unterminated command substitution")
            line += content.count("\n", i, close)
            out.append(_SUBST)
            problems.append("command substitution `...`")
            i = close + 1
            continue
        if quote == '"':
            out.append(c)
            line += c == "\n"
            quote = None if c == '"' else quote
            i += 1
            continue
        # outside quotes
        if c in "'\"":
            quote = c
            out.append(c)
        elif c == "#" and (not out or out[-1][-1:].isspace()):
            while i < n and content[i] != "\n":  # a comment runs to the end of the line
                i += 1
            continue
        elif c == "\n":
            end_statement()
            line += 1
            start = line
        else:
            if c in _OPERATORS:
                problems.append(f"the shell operator {c!r} (more than one plain assignment)")
            out.append(c)
        i += 1
    if quote:
        raise GrubConfigError(f"{path}:{start}", f"unterminated {quote} quote")
    end_statement()
    return statements


def _dollar(content: str, i: int, out: list[str], problems: list[str]) -> int:
    """Handle the expansion at ``content[i] == '$'``; return the index after it."""
    rest = content[i + 1 :]
    if rest.startswith("("):
        depth, j = 0, i + 1
        while j < len(content):
            depth += {"(": 1, ")": -1}.get(content[j], 0)
            if depth == 0:
                break
            j += 1
        out.append(_SUBST)
        problems.append("command substitution $(...)")
        return j + 1
    if rest.startswith("{"):
        close = content.find("}", i)
        inner = content[i + 2 : close] if close > 0 else rest
        if inner in _REF:
            out.append(_REF[inner])
        else:
            out.append(_OTHER)
            problems.append(f"the expansion ${{{inner}}}")
        return close + 1 if close > 0 else len(content)
    name = _NAME.match(rest)
    if name:
        if name[0] in _REF:
            out.append(_REF[name[0]])
        else:
            out.append(_OTHER)
            problems.append(f"the expansion ${name[0]}")
        return i + 1 + name.end()
    if rest[:1] and rest[0] in "0123456789@*#?$!-":
        out.append(_OTHER)
        problems.append(f"the expansion ${rest[0]}")
        return i + 2
    out.append("$")  # a lone $ is literal to the shell
    return i + 1


def _closing_backtick(content: str, i: int) -> int | None:
    j = i + 1
    while j < len(content):
        if content[j] == "\\":
            j += 2
            continue
        if content[j] == "`":
            return j
        j += 1
    return None


# --- evaluation --------------------------------------------------------------------------------


def _apply(
    origin: str,
    text: str,
    problems: list[str],
    state: dict[str, tuple[Param, ...]],
    blocks: list[str],
) -> None:
    operators = [p for p in problems if p.startswith("the shell operator") and "';'" not in p]
    if operators:
        raise GrubConfigError(origin, f"this line uses {operators[0]}")
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=";")
        lexer.whitespace_split = True
        lexer.commenters = ""
        words = list(lexer)
    except ValueError as exc:
        raise GrubConfigError(origin, f"cannot split the line ({exc})") from exc
    segment: list[str] = []
    for word in [*words, ";"]:  # `;` ends a command; separators are never words of their own
        if word != ";":
            segment.append(word)
        elif segment:
            _command(origin, segment, text, problems, state, blocks)
            segment = []


def _command(
    origin: str,
    words: list[str],
    text: str,
    problems: list[str],
    state: dict[str, tuple[Param, ...]],
    blocks: list[str],
) -> None:
    """One simple command: an assignment, `export`, or a word of an `if [ ... ]` block."""
    if words[0] in ("then", "else") and blocks:
        words = words[1:]  # `then X=1`: the command after the keyword
        if not words:
            return
    if words[0] in ("if", "elif") and (words[0] == "if" or blocks):
        test = words[2:3] if words[1:2] == ["!"] else words[1:2]
        if not test or test[0] in _SETS_VARIABLES or _ASSIGN.fullmatch(test[0]):
            shown = (test or ["nothing"])[0].replace("\0", "")
            raise GrubConfigError(origin, f"this if tests with {shown!r}, which can set variables")
        if words[0] == "if":
            blocks.append(origin)
        return
    if words == ["fi"] and blocks:
        blocks.pop()
        return
    exported = words[0] == "export"
    if exported:
        words = words[1:]
    assignments = []
    for word in words:
        match = _ASSIGN.fullmatch(word)
        if match:
            assignments.append((match[1], match[2]))
        elif not (exported and _NAME.fullmatch(word)):  # `export NAME` changes no value
            shown = words[0].replace("\0", "")
            raise GrubConfigError(origin, f"this line is a command ({shown!r}), not an assignment")
    for variable, value in assignments:
        if variable in state:
            if blocks:
                raise GrubConfigError(
                    origin,
                    f"{variable} is set inside the if block of {blocks[-1]}, so the shell decides "
                    "whether it applies",
                    CONDITIONAL_FIX,
                )
            state[variable] = _evaluate(origin, variable, value, problems, state)


def _evaluate(
    origin: str,
    variable: str,
    value: str,
    problems: list[str],
    state: dict[str, tuple[Param, ...]],
) -> tuple[Param, ...]:
    if _SUBST in value or _OTHER in value:
        kind = "substitution" if _SUBST in value else "the expansion"
        what = next((p for p in problems if kind in p), "an expansion")
        raise GrubConfigError(origin, f"{variable} uses {what}")
    params: list[Param] = []
    for word in value.split():
        ref = next((v for v, mark in _REF.items() if word == mark), None)
        if ref:
            params.extend(state[ref])
        elif "\0" in word:
            raise GrubConfigError(
                origin, f"{variable} glues a variable reference to other text ({word!r})"
            )
        elif any(c in word for c in "\"'$`\\"):
            shown = word.replace("\0", "")
            raise GrubConfigError(
                origin, f"{variable} has a parameter with quotes or $ ({shown!r})"
            )
        else:
            params.append(Param(value=word, variable=variable, origin=origin))
    return tuple(params)
