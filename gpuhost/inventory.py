"""Inventory helpers: validate a host's spec when pyinfra loads the inventory file.

An inventory file declares hosts with :func:`gpu_host`; the spec is validated right there, at
import, before pyinfra connects anywhere. A bad spec stops the run with one message per problem
naming the inventory file, the host, the field, the bad value and what would be valid.
"""

from __future__ import annotations

import inspect
import os
import runpy
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pyinfra.api.exceptions import InventoryError

from gpuhost.spec import HostSpec

SPEC_KEY = "gpuhost"  # host data key that holds the validated HostSpec


class SpecError(InventoryError, ValueError):
    """One or more problems in a host's spec."""

    def __init__(self, source: str, host: str, problems: list[str]) -> None:
        self.source, self.host, self.problems = source, host, problems
        lines = [f"{source}: host {host!r}: invalid gpuhost spec ({len(problems)} problem(s))"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


def _field_path(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("lxc", "vm") and path.endswith("]"):
            continue  # the discriminated-union tag pydantic inserts
        elif part.startswith("function-"):
            continue
        else:
            path += f".{part}" if path else part
    return path or "(spec)"


def _problem(error: Any) -> str:
    field = _field_path(error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        return f"{field}: unknown field; check the spelling against the inventory reference in README.md"
    if error["type"] == "missing":
        return f"{field}: required field is missing"
    value = error.get("input")
    if isinstance(value, dict):  # a check across fields: the message names them
        return f"{field}: {message}" if field != "(spec)" else message
    return f"{field} = {value!r}: {message}"


def validate_spec(source: str, host: str, data: dict[str, Any]) -> HostSpec:
    """Validate raw spec data; raise :class:`SpecError` naming every problem."""
    try:
        return HostSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, host, [_problem(e) for e in exc.errors()]) from None


def gpu_host(
    name: str, spec: dict[str, Any], source: str | None = None, **host_data: Any
) -> tuple[str, dict[str, Any]]:
    """An inventory entry ``(name, data)`` whose ``data["gpuhost"]`` is the validated spec.

    + name: the pyinfra host name (also the SSH host unless ``ssh_hostname`` is given)
    + spec: the host spec as plain data (see README, "Inventory reference")
    + source: the inventory file, for error messages (default: the caller's file)
    + host_data: other pyinfra host data, e.g. ``ssh_hostname``, ``ssh_user``
    """
    if source is None:
        source = inspect.stack()[1].filename
    source = os.path.relpath(source) if os.path.isabs(source) else source
    return name, {**host_data, SPEC_KEY: validate_spec(source, name, spec)}


def load_inventory(path: str | Path) -> dict[str, tuple[HostSpec, dict[str, Any]]]:
    """Read an inventory file the way pyinfra does and return host -> (spec, other host data)."""
    namespace = runpy.run_path(str(path))
    hosts: dict[str, tuple[HostSpec, dict[str, Any]]] = {}
    for key, value in namespace.items():
        if key.startswith("_") or not isinstance(value, list | tuple):
            continue
        entries = value[0] if isinstance(value, tuple) and isinstance(value[0], list) else value
        for entry in entries:
            if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], dict):
                name, data = entry
                if isinstance(data.get(SPEC_KEY), HostSpec):
                    rest = {k: v for k, v in data.items() if k != SPEC_KEY}
                    hosts[name] = (data[SPEC_KEY], rest)
    if not hosts:
        raise InventoryError(
            f"{path}: no gpuhost hosts; declare them with gpuhost.inventory.gpu_host()"
        )
    return hosts
