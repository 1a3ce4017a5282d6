"""PCI resource mappings: /etc/pve/mapping/pci.cfg and /cluster/mapping/pci (stdlib only).

Sources: pve-guest-common PVE/Mapping/PCI.pm (the section-config schema, `assert_valid`,
`get_node_mapping`) and pve-manager PVE/API2/Cluster/Mapping/PCI.pm (the API: list shows only
mappings the caller has Mapping.Modify, Mapping.Use or Mapping.Audit on /mapping/pci/<id>;
create and delete need Mapping.Modify on /mapping/pci, update on /mapping/pci/<id>). The file:

    gpu0
    <TAB>map node=pve1,path=0000:41:00,id=10de:2bb1,iommugroup=12,subsystem-id=10de:204b
    <TAB>description ...

one header line per id (no type: the file holds only pci sections), then a tab-indented line
per property, required `map` lines first, the optional ones sorted, a blank line after each.
The digest is the SHA-1 of the whole file (as cfs_read_file gives it).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from . import access
from . import config as cfg
from .guest_state import file_lock
from .schema import (
    FormatError,
    ParamError,
    Prop,
    PveError,
    parse_property_string,
    split_list,
    validate,
    verify_configid,
)
from .sysfstools import device_info

PCI_CFG = "etc/pve/mapping/pci.cfg"
_PCI = r"[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"
_HEXPAIR = r"[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}"


def _verify_node(value: str) -> None:
    """pve-node: a DNS label."""
    if not re.fullmatch(r"(?=.{1,63}$)[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?", value):
        raise FormatError("value does not look like a valid node name")


MAP_FMT: dict[str, Prop] = {
    "node": Prop(optional=False, format=_verify_node),
    "id": Prop(optional=False, pattern=_HEXPAIR),
    "subsystem-id": Prop(pattern=_HEXPAIR),
    "path": Prop(optional=False, pattern=rf"(?:{_PCI};)*{_PCI}"),
    "iommugroup": Prop(type="integer"),
    "description": Prop(max_length=4096),
}
_BOOL = Prop(type="boolean")
OPTIONS = ("description", "live-migration-capable", "mdev")  # the optional ones, sorted
PROPS: dict[str, Prop] = {
    "description": Prop(max_length=4096),
    "mdev": _BOOL,
    "live-migration-capable": _BOOL,
}
CREATE_SCHEMA = {"id": Prop(optional=False, format=verify_configid), **PROPS}
UPDATE_SCHEMA = {
    "id": Prop(optional=False, format=verify_configid),
    **PROPS,
    "delete": Prop(max_length=4096),
    "digest": Prop(max_length=64),
}

Section = dict[str, object]  # {"map": [str, ...], "description": str, "mdev": "1", ...}


# --- the file ---


def _raw(root: Path) -> str:
    try:
        return (root / PCI_CFG).read_text()
    except FileNotFoundError:
        return ""


def digest(root: Path) -> str:
    return hashlib.sha1(_raw(root).encode()).hexdigest()


def parse(text: str) -> dict[str, Section]:
    """SectionConfig::parse_config with PCI.pm's header (an id alone on a line)."""
    sections: dict[str, Section] = {}
    current: Section | None = None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            current = None if not line.strip() else current
            continue
        if not line[0].isspace():
            m = re.fullmatch(r"(\S+)\s*", line)
            try:
                verify_configid(m.group(1) if m else "")
            except FormatError:
                current = None  # Proxmox skips the whole section
                continue
            current = sections.setdefault(m.group(1), {"map": []})  # type: ignore[union-attr]
            continue
        if current is None:
            continue
        m = re.fullmatch(r"\s+(\S+)(?:\s+(.*?))?\s*", line)
        if not m:
            continue
        key, value = m.group(1), m.group(2) or ""
        if key == "map":
            current["map"].append(value)  # type: ignore[union-attr]
        elif key in PROPS:
            current[key] = value
    return sections


def format_cfg(sections: dict[str, Section]) -> str:
    out = ""
    for sid, sec in sections.items():
        out += f"{sid}\n"
        out += "".join(f"\tmap {m}\n" for m in sec.get("map", []))  # type: ignore[union-attr]
        for key in OPTIONS:
            if key in sec:
                out += f"\t{key} {sec[key]}\n"
        out += "\n"
    return out


def load(root: Path) -> dict[str, Section]:
    return parse(_raw(root))


def save(root: Path, sections: dict[str, Section]) -> None:
    path = root / PCI_CFG
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(format_cfg(sections))
    os.replace(tmp, path)


def find_on_node(root: Path, name: str, node: str) -> list[dict[str, str]] | None:
    """get_node_mapping: this node's map entries (unparsable ones are skipped), None if the
    mapping does not exist."""
    sec = load(root).get(name)
    if sec is None:
        return None
    entries = []
    for text in sec.get("map", []):  # type: ignore[union-attr]
        try:
            entry = parse_property_string(MAP_FMT, str(text))
        except FormatError:
            continue
        if entry.get("node") == node:
            entries.append(entry)
    return entries


def assert_valid(root: Path, name: str, entry: dict[str, str], cluster: Section | None) -> None:
    """Mapping::PCI::assert_valid: each path's device must still be what the map says."""
    for idx, path in enumerate(entry.get("path", "").split(";")):
        if not re.search(r"\.[a-f0-9]$", path, re.I):
            path = f"{path}.0"  # whole device: its function 0 must exist
        info = device_info(root, path)
        if info is None:
            raise PveError(f"pci device '{path}' not found")
        expected: dict[str, str | None] = {
            "id": f"{info['vendor']}:{info['device']}",
            "iommugroup": str(info["iommugroup"]) if "iommugroup" in info else None,
            "subsystem-id": None,
        }
        if "subsystem_vendor" in info and "subsystem_device" in info:
            expected["subsystem-id"] = f"{info['subsystem_vendor']}:{info['subsystem_device']}"
        configured = {k: entry.get(k) for k in ("id", "iommugroup", "subsystem-id")}
        if cluster is not None:
            expected["mdev"] = "1" if info.get("mdev") else "0"
            configured["mdev"] = "1" if cluster.get("mdev") == "1" else "0"
        for prop in sorted(expected):
            if prop == "iommugroup" and idx > 0:
                continue  # only the first device's group is checked
            want, have = expected[prop], configured.get(prop)
            if want is None and have is None:
                continue
            if have is None:
                raise PveError(f"missing expected property '{prop}' for device '{path}'")
            if want is None:
                raise PveError(f"unexpected property '{prop}' configured for device '{path}'")
            want, have = want.replace("0x", ""), have.replace("0x", "")
            if want != have:
                raise PveError(f"'{prop}' does not match for '{name}' ({want} != {have})")


# --- the API (routes.py maps /cluster/mapping/pci[/{id}] here) ---


def _maps(params: dict[str, object], required: bool) -> list[str] | None:
    value = params.pop("map", None)
    if value is None:
        if required:
            raise ParamError({"map": "property is missing and it is not optional"})
        return None
    items = value if isinstance(value, list) else [value]
    errors = {}
    for i, item in enumerate(items):
        try:
            parse_property_string(MAP_FMT, str(item))
        except FormatError as exc:
            errors[f"map[{i}]" if len(items) > 1 else "map"] = f"invalid format - {exc}"
    if errors:
        raise ParamError(errors)
    return [str(i) for i in items]


def _scalar(params: dict[str, object], schema: dict[str, Prop]) -> dict[str, str]:
    out = {}
    for key, value in params.items():
        if isinstance(value, list):
            raise ParamError({key: "property is not an array"})  # only `map` repeats
        out[key] = str(value)
    validate(out, schema)
    return out


def api_list(root: Path, params: dict[str, str]) -> list[dict[str, object]]:
    check_node = params.get("check-node")
    node = cfg.node_name(root)
    if check_node is not None and check_node not in ("localhost", node):
        raise PveError(f"wrong node to check - {check_node} != {node}")
    sections, dig = load(root), digest(root)
    out = []
    for sid, sec in sections.items():  # Perl walks a hash: no fixed order
        if not access.allowed(
            root, f"/mapping/pci/{sid}", ["Mapping.Modify", "Mapping.Use", "Mapping.Audit"], True
        ):
            continue
        entry: dict[str, object] = {**_typed(sec), "id": sid, "digest": dig}
        if check_node is not None:
            checks: list[dict[str, str]] = []
            entries = find_on_node(root, sid, node) or []
            if not entries:
                checks.append({"severity": "warning", "message": f"No mapping for node {node}."})
            for e in entries:
                try:
                    assert_valid(root, sid, e, sec)
                except PveError as exc:
                    checks.append(
                        {"severity": "error", "message": f"Invalid configuration: {exc.msg}"}
                    )
            entry["checks"] = checks
        out.append(entry)
    return out


def _typed(sec: Section) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in sec.items():
        out[key] = int(str(value)) if key in ("mdev", "live-migration-capable") else value
    return out


def api_get(root: Path, sid: str) -> dict[str, object]:
    access.check(
        root, f"/mapping/pci/{sid}", ["Mapping.Use", "Mapping.Modify", "Mapping.Audit"], True
    )
    sec = load(root).get(sid)
    if sec is None:
        raise PveError(f"mapping '{sid}' not found")
    return {**_typed(sec), "digest": digest(root)}


def api_create(root: Path, params: dict[str, object]) -> None:
    access.check(root, "/mapping/pci", ["Mapping.Modify"])
    params = dict(params)
    maps = _maps(params, required=True)
    values = _scalar(params, CREATE_SCHEMA)
    sid = values.pop("id")
    with file_lock(root, "mapping-pci"):
        sections = load(root)
        if sid in sections:
            raise PveError(f"create hardware mapping failed: pci ID '{sid}' already defined")
        sections[sid] = {"map": maps, **values}
        save(root, sections)


def api_update(root: Path, sid: str, params: dict[str, object]) -> None:
    access.check(root, f"/mapping/pci/{sid}", ["Mapping.Modify"])
    params = dict(params)
    params["id"] = sid
    maps = _maps(params, required=False)
    values = _scalar(params, UPDATE_SCHEMA)
    values.pop("id")
    want_digest = values.pop("digest", None)
    deletes = split_list(values.pop("delete", ""))
    with file_lock(root, "mapping-pci"):
        sections = load(root)
        if want_digest and want_digest != digest(root):
            raise PveError(
                "update hardware mapping failed: detected modified configuration - file "
                "changed by other user? Try again."
            )
        if sid not in sections:
            raise PveError(f"update hardware mapping failed: pci ID '{sid}' does not exist")
        sec = sections[sid]
        for key in deletes:
            if key != "map" and key not in PROPS:
                raise PveError(f"update hardware mapping failed: no such option '{key}'")
            if key == "map":
                raise PveError(
                    f"update hardware mapping failed: unable to delete required option '{key}'"
                )
            if key in values:
                raise PveError(
                    f"update hardware mapping failed: cannot set and delete property '{key}' "
                    "at the same time!"
                )
            sec.pop(key, None)
        if maps is not None:
            sec["map"] = maps
        sec.update(values)
        save(root, sections)


def api_delete(root: Path, sid: str) -> None:
    access.check(root, "/mapping/pci", ["Mapping.Modify"])
    verify_configid(sid)
    with file_lock(root, "mapping-pci"):
        sections = load(root)
        sections.pop(sid, None)
        save(root, sections)
