"""Proxmox's JSON-schema checks, re-implemented for the twin (stdlib only).

Mirrors pve-common PVE::JSONSchema (check_prop, parse_property_string, parse_boolean) closely
enough that the error texts are the ones Proxmox prints, e.g.

    400 Parameter verification failed.
    dev0: invalid format - format error
    dev0.mode: value does not match the regex pattern

The option tables for containers (pve-container PVE::LXC::Config $confdesc) and VMs (qemu-server
PVE::QemuServer $confdesc) live in options.py; this module only knows how to check values.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field


class PveError(Exception):
    """A Proxmox die(): the message is printed as is and the CLI exits 255.

    `code` is the HTTP status the API answers with (Proxmox uses 500 for plain dies).
    """

    def __init__(self, msg: str, code: int = 500, usage: str | None = None) -> None:
        super().__init__(msg)
        self.msg = msg if msg.endswith("\n") else msg + "\n"
        self.code = code
        self.usage = usage

    def text(self) -> str:
        """What PVE::Exception::stringify prints."""
        head = f"{self.code} {self.msg}" if self.code != 500 else self.msg
        return head + (self.usage or "")


class ParamError(PveError):
    """raise_param_exc: HTTP 400 with one error per parameter."""

    def __init__(self, errors: dict[str, str], msg: str = "Parameter verification failed.") -> None:
        super().__init__(msg, code=400)
        self.errors = errors

    def text(self) -> str:
        out = f"400 {self.msg}"
        # perl walks a hash here (random order); sorted keeps the twin deterministic
        for key in sorted(self.errors):
            out += f"{key}: {self.errors[key]}\n"
        if self.usage:
            out += self.usage
        return out


class FormatError(Exception):
    """A format check failed; str() is the perl $@ text (ends with a newline)."""

    def __init__(self, msg: str, errors: dict[str, str] | None = None) -> None:
        self.errors = errors or {}
        text = msg if msg.endswith("\n") else msg + "\n"
        for key in sorted(self.errors):
            text += f"{key}: {self.errors[key]}\n"
        super().__init__(text)


Validator = Callable[[str], None]


@dataclass(frozen=True)
class Prop:
    """One schema property (a subset of PVE::JSONSchema's keywords)."""

    type: str = "string"  # string | integer | number | boolean
    optional: bool = True
    minimum: float | None = None
    maximum: float | None = None
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    max_length: int | None = None
    # a named validator, or a property-string format (dict of sub-properties)
    format: Validator | dict[str, Prop] | None = None
    default_key: bool = False
    extra: dict[str, object] = field(default_factory=dict)


def parse_boolean(value: str) -> int | None:
    """PVE::JSONSchema::parse_boolean."""
    if re.fullmatch(r"(?i)1|on|yes|true", value):
        return 1
    if re.fullmatch(r"(?i)0|off|no|false", value):
        return 0
    return None


def is_number(value: str) -> bool:
    return bool(re.fullmatch(r"[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?", value))


def is_integer(value: str) -> bool:
    return bool(re.fullmatch(r"[+-]?\d+", value))


def _add_error(errors: dict[str, str], path: str, msg: str) -> None:
    path = path or "_root"
    errors[path] = f"{errors[path]}\\n{msg}" if path in errors else msg


def check_format(fmt: Validator | dict[str, Prop], value: str, path: str = "") -> None:
    """Raise FormatError like PVE::JSONSchema::check_format."""
    if isinstance(fmt, dict):
        parse_property_string(fmt, value, path)
    else:
        fmt(value)


def check_prop(value: str | None, prop: Prop, path: str, errors: dict[str, str]) -> None:
    """PVE::JSONSchema::check_prop for scalar values."""
    if value is None:
        if not prop.optional:
            _add_error(errors, path, "property is missing and it is not optional")
        return
    if prop.type == "boolean" and value not in ("0", "1"):
        _add_error(errors, path, f"type check ('boolean') failed - got '{value}'")
        return
    if prop.type == "integer" and not is_integer(value):
        _add_error(errors, path, f"type check ('integer') failed - got '{value}'")
        return
    if prop.type == "number" and not is_number(value):
        _add_error(errors, path, f"type check ('number') failed - got '{value}'")
        return
    if prop.format is not None:
        try:
            check_format(prop.format, value, path)
        except FormatError as exc:
            _add_error(errors, path, f"invalid format - {exc}")
            return
    if prop.pattern is not None and not re.fullmatch(prop.pattern, value):
        _add_error(errors, path, "value does not match the regex pattern")
        return
    if prop.max_length is not None and len(value) > prop.max_length:
        _add_error(errors, path, f"value may only be {prop.max_length} characters long")
        return
    if is_number(value):
        if prop.maximum is not None and float(value) > prop.maximum:
            _add_error(errors, path, f"value must have a maximum value of {_num(prop.maximum)}")
            return
        if prop.minimum is not None and float(value) < prop.minimum:
            _add_error(errors, path, f"value must have a minimum value of {_num(prop.minimum)}")
            return
    if prop.enum is not None and value not in prop.enum:
        _add_error(
            errors,
            path,
            f"value '{value}' does not have a value in the enumeration '{', '.join(prop.enum)}'",
        )


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def parse_property_string(fmt: dict[str, Prop], data: str, path: str = "") -> dict[str, str]:
    """PVE::JSONSchema::parse_property_string: 'key=value,...' with an optional default key."""
    res: dict[str, str] = {}
    default_key: str | None = None
    for part in data.split(","):
        if not part.strip():
            continue
        m = re.fullmatch(r"([^=]+)=(.+)", part, re.S)
        if m:
            key, value = m.group(1), m.group(2)
            if key in res:
                raise FormatError(f"duplicate key in comma-separated list property: {key}")
            schema = fmt.get(key)
            if schema is None:
                raise FormatError(f"invalid key in comma-separated list property: {key}")
            if schema.type == "boolean":
                parsed = parse_boolean(value)
                value = str(parsed) if parsed is not None else value
            res[key] = value
        elif "=" not in part:
            if default_key:
                raise FormatError(f"duplicate key in comma-separated list property: {default_key}")
            for key, schema in fmt.items():
                if schema.default_key:
                    default_key = key
                    if key in res:
                        raise FormatError(f"duplicate key in comma-separated list property: {key}")
                    res[key] = part
                    break
            if default_key is None:
                raise FormatError("value without key, but schema does not define a default key")
        else:
            raise FormatError("missing key in comma-separated list property")
    errors: dict[str, str] = {}
    for key, schema in fmt.items():
        check_prop(res.get(key), schema, f"{path}.{key}" if path else key, errors)
    if errors:
        raise FormatError("format error", errors)
    return res


def print_property_string(fmt: dict[str, Prop], values: dict[str, str]) -> str:
    """PVE::JSONSchema::print_property_string: default key first (bare), the rest sorted."""
    parts: list[str] = []
    keys = sorted(values)
    for key in keys:
        if fmt.get(key, Prop()).default_key:
            parts.append(values[key])
    for key in keys:
        if not fmt.get(key, Prop()).default_key:
            parts.append(f"{key}={values[key]}")
    return ",".join(parts)


def validate(params: dict[str, str], schema: dict[str, Prop]) -> None:
    """Check API parameters: unknown keys and bad values raise ParamError (HTTP 400)."""
    errors: dict[str, str] = {}
    for key, value in params.items():
        prop = schema.get(key)
        if prop is None:
            _add_error(
                errors,
                key,
                "property is not defined in schema and the schema does not allow "
                "additional properties",
            )
            continue
        check_prop(value, prop, key, errors)
    for key, prop in schema.items():
        if not prop.optional and key not in params:
            _add_error(errors, key, "property is missing and it is not optional")
    if errors:
        raise ParamError(errors)


def split_list(value: str) -> list[str]:
    """PVE::Tools::split_list."""
    return [item for item in re.split(r"[,;\s\0]+", value.strip()) if item]


# --- named formats used by the option tables (PVE::JSONSchema / pve-container) ---


def verify_vmid(value: str) -> None:
    if not re.fullmatch(r"[1-9][0-9]{2,8}", value):
        raise FormatError("value does not look like a valid VM ID")


def verify_configid(value: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9_-]+", value):
        raise FormatError(f"invalid configuration ID '{value}'")


def verify_configid_list(value: str) -> None:
    for item in split_list(value):
        verify_configid(item)


def verify_volume_id(value: str) -> None:
    if not re.fullmatch(r"(?i:[a-z][a-z0-9\-_.]*[a-z0-9]):(.+)", value, re.S):
        raise FormatError(f"unable to parse volume ID '{value}'")


def verify_dns_name(value: str) -> None:
    label = r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?"
    if not re.fullmatch(rf"{label}(\.{label})*", value):
        raise FormatError(f"value '{value}' does not look like a valid DNS name")


def verify_lxc_mp_string(value: str) -> None:
    """pve-container verify_lxc_mp_string."""
    if re.search(r"/\.\.?/", value) or re.search(r"/\.\.?$", value) or value.startswith("../"):
        raise FormatError(f"{value} contains illegal character sequences")


def verify_lxc_dev_string(value: str) -> None:
    """pve-container verify_lxc_dev_string."""
    if re.search(r"/\.\.?(?:/|$)", value) or not value.startswith("/dev/"):
        raise FormatError(f"{value} is not a valid device path")


def verify_tag_list(value: str) -> None:
    for tag in split_list(value):
        if not re.fullmatch(r"[a-z0-9_][a-z0-9_\-+.]*", tag, re.I):
            raise FormatError(f"invalid tag '{tag}'")


def verify_disk_size(value: str) -> None:
    if parse_size(value) is None:
        raise FormatError(f"unable to parse size '{value}'")


def parse_size(value: str) -> int | None:
    """PVE::JSONSchema::parse_size: '8G' -> bytes."""
    m = re.fullmatch(r"(\d+(\.\d+)?)([KMGT])?", value)
    if not m:
        return None
    factor = {None: 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(3)]
    return int(float(m.group(1)) * factor)


def accept_any(value: str) -> None:
    """Formats the twin does not check (address lists, MACs, ...)."""
    del value


STARTUP_FMT: dict[str, Prop] = {
    "order": Prop(type="integer", minimum=0, default_key=True),
    "up": Prop(type="integer", minimum=0),
    "down": Prop(type="integer", minimum=0),
}
