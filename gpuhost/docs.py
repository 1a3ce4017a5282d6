"""The README's inventory reference, generated from the spec models (a test fails on drift).

python -m gpuhost.docs            # rewrite the reference block in README.md
"""

from __future__ import annotations

import re
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gpuhost.spec.grammar import GRAMMARS
from gpuhost.spec.guests import LxcGuest, VmGuest
from gpuhost.spec.host import HostSpec

START, END = "<!-- inventory-reference:start -->", "<!-- inventory-reference:end -->"
README = Path(__file__).parents[1] / "README.md"


def _type_name(annotation: object) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: typing.Any) -> str:
    if field.default is not PydanticUndefined:
        return f"`{field.default!r}`"
    if field.default_factory is not None:
        value = field.default_factory()
        return f"`{value!r}`" if not isinstance(value, BaseModel) else "(defaults below)"
    return "**required**"


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows, nested = [], []
    for name, field in model.model_fields.items():
        if name == "kind":
            continue
        path = f"{prefix}{name}"
        rows.append(
            f"| `{path}` | {_type_name(field.annotation)} | {_default(field)} | {field.description or ''} |"
        )
        inner = [
            a
            for a in typing.get_args(field.annotation) or (field.annotation,)
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            inner = [field.annotation]
        for sub in inner:
            if sub not in (LxcGuest, VmGuest):
                nested += _rows(
                    sub, f"{path}{'[]' if typing.get_origin(field.annotation) is list else ''}."
                )
    return rows + nested


def inventory_reference() -> str:
    head = ["| field | type | default | meaning |", "|---|---|---|---|"]
    parts = ["#### Host (`spec=`)", "", *head, *_rows(HostSpec, "")]
    for guest, title in ((LxcGuest, "`kind: lxc`"), (VmGuest, "`kind: vm`")):
        parts += [
            "",
            f"#### Guests, {title}",
            "",
            re.sub(r"\s+", " ", guest.__doc__ or "").strip(),
            "",
            *head,
            *_rows(guest, ""),
        ]
    parts += [
        "",
        "#### Value grammars",
        "",
        "Inventory values are untrusted text: each is matched as a whole (a trailing newline is "
        "refused), ASCII only. A refusal names the file, the host, the field, the value (secrets "
        "as `***`) and the fix, for every problem at once.",
        "",
        "| value | grammar |",
        "|---|---|",
        *(f"| {name} | {rule.replace('|', chr(92) + '|')} |" for name, rule in GRAMMARS.items()),
    ]
    return "\n".join(parts)


def readme_block() -> str:
    text = README.read_text()
    return text[text.index(START) + len(START) : text.index(END)].strip("\n")


def main() -> int:
    text = README.read_text()
    new = (
        text[: text.index(START) + len(START)]
        + "\n"
        + inventory_reference()
        + "\n"
        + text[text.index(END) :]
    )
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
