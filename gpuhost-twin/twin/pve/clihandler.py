"""How the twin's Proxmox tools take arguments and print (stdlib only), after pve-common
PVE::JSONSchema::get_options / PVE::CLIHandler: `-opt value`, `--opt value`, `--opt=value`,
booleans with an optional value, positional arguments, and the same failure texts ("Unknown
option: foo" + "400 unable to parse option", "400 Parameter verification failed." + one line per
parameter, then the short usage)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .schema import ParamError, Prop, PveError, parse_boolean

if TYPE_CHECKING:
    from .boot_functions import Out


class Output:
    """stdout/stderr of one tool run (kept apart so tests can check both)."""

    def __init__(self) -> None:
        self.stdout: list[str] = []  # chunks, newlines included
        self.stderr: list[str] = []

    def out(self, line: str) -> None:
        self.stdout.append(line + "\n")

    def err(self, line: str) -> None:
        self.stderr.append(line + "\n")

    def take(self, bo: Out) -> None:
        self.stdout += [line + "\n" for line in bo.stdout]
        self.stderr += [line + "\n" for line in bo.stderr]


# --- PVE::JSONSchema::get_options ---


def get_options(
    schema: dict[str, Prop], args: list[str], arg_params: list[str], usage: str, out: Output
) -> dict[str, str]:
    opts: dict[str, str] = {}
    positional: list[str] = []
    failed = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            positional += args[i:]
            break
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        name, has_value, value = arg.lstrip("-").partition("=")
        prop = schema.get(name)
        if prop is None:
            out.err(f"Unknown option: {name}")
            failed = True
            continue
        if not has_value:
            if prop.type == "boolean":  # optional value (Getopt ':s')
                value = ""
                if i < len(args) and not args[i].startswith("-"):
                    value, i = args[i], i + 1
            elif i < len(args):
                value, i = args[i], i + 1
            else:
                out.err(f"Option {name} requires an argument")
                failed = True
                continue
        if prop.extra.get("array"):  # an array property: the option repeats (--map a --map b)
            opts.setdefault(name, [])  # type: ignore[arg-type]
            opts[name].append(value)  # type: ignore[attr-defined]
            continue
        opts[name] = value
    if failed:
        raise PveError("unable to parse option", code=400, usage=usage)
    for name, value in list(opts.items()):
        if schema[name].type == "boolean":
            parsed = 1 if value == "" else parse_boolean(value)
            if parsed is None:
                raise ParamError({name: "unable to parse boolean option"})
            opts[name] = str(parsed)
    for name in arg_params:
        if name == "extra-args":
            opts[name] = json.dumps(positional)
            positional = []
            continue
        if not positional:
            raise PveError("not enough arguments", code=400, usage=usage)
        opts[name] = positional.pop(0)
    if positional:
        raise PveError("too many arguments", code=400, usage=usage)
    return opts


# --- pct / qm ---

_BOOL = Prop(type="boolean")


def _abort(tool: str, reason: str, out: Output) -> int:
    out.err(f"ERROR: {reason}")
    out.err(f"USAGE: {tool} <COMMAND> [ARGS] [OPTIONS]")
    return 255
