"""A spec's validation errors as messages: one line per problem, naming the field the way the
inventory writes it (``guests[0].gpus``, ``boot.extra[2]``), the bad value (never a secret's) and
what would be valid; an unknown field gets its closest spelling."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuhost.redact import is_secret_name, mask_secrets, show
from gpuhost.spec.guests import GUEST_KINDS
from gpuhost.spec.host import HostSpec


def _models_in(annotation: Any) -> list[Any]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _models_in(args[0])
    if origin in (typing.Union, types.UnionType, list):
        return [m for a in args for m in _models_in(a)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The spec model a location points into, following pydantic's raw error location."""
    model: Any = HostSpec
    for part in loc:
        if isinstance(part, int):
            continue
        if isinstance(model, list):  # the guest union: the next part is its tag
            model = GUEST_KINDS.get(part)
            continue
        if model is None or part not in model.model_fields:
            return None
        inner = _models_in(model.model_fields[part].annotation)
        model = inner[0] if len(inner) == 1 else (inner or None)
    return model if isinstance(model, type) else None


def _is_dict_field(loc: tuple[int | str, ...]) -> bool:
    model = _model_at(loc[:-1])
    if model is None or not isinstance(loc[-1], str) or loc[-1] not in model.model_fields:
        return False
    annotation = model.model_fields[loc[-1]].annotation
    return typing.get_origin(annotation) is dict


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for n, part in enumerate(loc):
        previous = loc[n - 1] if n else None
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in GUEST_KINDS and isinstance(previous, int) and loc[:1] == ("guests",):
            pass  # the discriminated-union tag pydantic inserts
        elif part in ("list", "rest") and previous == "gpus":
            pass  # the tag of the gpus union
        elif part == "[key]":
            path += " (the name)"
        elif n and _is_dict_field(loc[:n]):
            path += f"[{show(part, 40)}]"
        else:
            path += f".{part}" if path else part
    return path or "(spec)"


def _is_secret(loc: tuple[int | str, ...]) -> bool:
    return "env" in loc or any(is_secret_name(p) for p in loc)


def _unknown_field(loc: tuple[int | str, ...], path: str) -> str:
    name, parent = loc[-1], loc[:-1]
    model = _model_at(parent)
    if not isinstance(name, str) or model is None:
        return f"{path}: unknown field"
    kind = parent[-1] if parent and parent[0] == "guests" and parent[-1] in GUEST_KINDS else None
    for other, other_model in GUEST_KINDS.items():
        if kind and other != kind and name in other_model.model_fields:
            return f"{path}: {name!r} is a field of {other} guests, this guest is kind {kind!r}"
    close = difflib.get_close_matches(name, list(model.model_fields), n=1, cutoff=0.6)
    if close:
        base = path[: -len(name)] if path.endswith(name) else ""
        return f"{path}: unknown field; did you mean {base}{close[0]}?"
    return f"{path}: unknown field; check the spelling against docs/reference/inventory.md"


TYPE_HINTS = {
    "int_type": "write a whole number without quotes",
    "bool_type": "write True or False",
    "string_type": "write it as a string, in quotes",
    "list_type": "write a list, in [ ]",
    "dict_type": "write a mapping, in { }",
    "model_type": "write a mapping of fields, in { }",
    "model_attributes_type": "write a mapping of fields, in { }",
}


def _problem(error: Any) -> str:
    loc = tuple(error["loc"])
    path = _field_path(loc)
    kind = error["type"]
    message = mask_secrets(error["msg"].removeprefix("Value error, "))
    value = error.get("input")
    if kind == "extra_forbidden":
        return _unknown_field(loc, path)
    if kind == "missing":
        return f"{path}: required field is missing"
    if kind == "union_tag_not_found":
        return f"{path}.kind: required field is missing; write 'lxc' (a container) or 'vm'"
    if kind == "union_tag_invalid":
        tag = value.get("kind") if isinstance(value, dict) else value
        return f"{path}.kind = {show(tag)}: write 'lxc' (a container) or 'vm'"
    if kind == "cross_field":
        return f"{path}: {message}"
    if path.endswith(".gpus") and kind in ("literal_error", "list_type"):
        message = "give a list of PCI addresses/nvidia-smi indexes, or 'rest'"
    elif kind in TYPE_HINTS:
        hint = TYPE_HINTS[kind]
        if kind == "int_type" and isinstance(value, bool):
            hint = "True/False is not a number; " + hint
        message = f"{message}; {hint}"
    shown = "'***'" if _is_secret(loc) else show(value)
    return f"{path} = {shown}: {message}"


def describe(exc: ValidationError) -> list[str]:
    """One line per problem (SpecError caps them at MAX_PROBLEMS)."""
    lines: dict[str, None] = {}
    for error in exc.errors(include_url=False):
        lines.setdefault(_problem(error))
    return list(lines)
