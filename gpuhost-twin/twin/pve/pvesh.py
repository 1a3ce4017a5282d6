"""pvesh get/set/create/delete over the twin's API routes (docs/reference/formats.md §4; stdlib only)."""

from __future__ import annotations

import json
from pathlib import Path

from . import routes
from .clihandler import _BOOL, Output, _abort, get_options
from .schema import Prop, PveError

# --- pvesh ---

FORMAT_OPTIONS = {
    "output-format": Prop(enum=("text", "json", "json-pretty", "yaml")),
    "noproxy": _BOOL,
    "quiet": _BOOL,
    "human-readable": _BOOL,
    "noborder": _BOOL,
    "noheader": _BOOL,
}


PVESH_METHODS = {"get": "GET", "set": "PUT", "create": "POST", "delete": "DELETE"}


def pvesh(root: Path, argv: list[str], out: Output) -> int:
    if not argv:
        return _abort("pvesh", "no command specified", out)
    cmd, args = argv[0], argv[1:]
    if cmd not in PVESH_METHODS:
        return _abort("pvesh", f"unknown command 'pvesh {cmd}'", out)
    method = PVESH_METHODS[cmd]
    usage = f"pvesh {cmd} <api_path> [OPTIONS] [FORMAT_OPTIONS]\n"
    path = next((a for a in args if not a.startswith("-")), "")
    found = routes.find_route(method, path) if path else None
    try:
        if path and found is None:
            raise PveError(f"No '{cmd}' handler defined for '{path}'")
        schema = {**(found[0].params if found else {}), **FORMAT_OPTIONS}
        params = get_options(schema, args, ["api_path"], usage, out)
        params.pop("api_path")
        fmt = params.pop("output-format", "text")
        for key in FORMAT_OPTIONS:
            params.pop(key, None)
        result = routes.call(root, method, path, params)
    except PveError as exc:
        if exc.code == 400 and exc.usage is None:
            exc.usage = usage
        out.err(exc.text().removesuffix("\n"))
        return 255
    for line in result.stdout:
        out.out(line)
    for line in result.warnings:
        out.err(line)
    if result.task_error:
        out.err(f"TASK ERROR: {result.task_error.strip()}")
    data = result.data
    if data is None:
        return 0  # methods returning null print nothing, in every format
    if fmt == "json":
        out.out(json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
    elif fmt == "json-pretty":
        out.out(
            json.dumps(data, sort_keys=True, indent=3, separators=(",", " : "), ensure_ascii=False)
        )
    elif isinstance(data, str | int | float):
        out.out(str(data))
    else:
        out.err("twin: pvesh's text/yaml tables are not simulated; use --output-format json")
        return 255
    return 0
