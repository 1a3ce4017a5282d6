"""The slice of the Proxmox API tree the twin serves, shared by pvesh and the HTTPS API.

Paths, parameters and return shapes follow pve-manager/pve-container/qemu-server API2 modules
(formats.md §4): /version, /nodes, /nodes/{node}/{lxc,qemu}[/{vmid}[/config|/pending|/status/...]],
/nodes/{node}/tasks/{upid}/status. Handlers (api_handlers.py) return plain data; the caller wraps it
({"data": ...} over HTTPS, bare JSON from pvesh).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from . import config_update as cu
from .api_handlers import (
    CREATE_EXTRA,
    Handler,
    Result,
    create_guest,
    delete_guest,
    get_config,
    get_node_index,
    get_nodes,
    get_pending,
    get_status_current,
    get_status_index,
    get_task_status,
    get_version,
    guest_index,
    list_guests,
    post_qemu_config,
    post_startall,
    post_status,
    post_stopall,
    put_config,
)
from .schema import Prop, PveError, split_list, validate, verify_configid, verify_vmid


@dataclass(frozen=True)
class Route:
    method: str
    pattern: str  # with {name} placeholders
    handler: Handler
    params: dict[str, Prop] = field(default_factory=dict)

    def match(self, path: str) -> dict[str, str] | None:
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.pattern))
        m = re.fullmatch(regex, path)
        return m.groupdict() if m else None


_BOOL = Prop(type="boolean")
_CONFIG_GET = {"current": _BOOL, "snapshot": Prop(format=verify_configid)}
_START = {"skiplock": _BOOL, "debug": _BOOL, "timeout": Prop(type="integer", minimum=0)}
_STOP = {"skiplock": _BOOL, "timeout": Prop(type="integer", minimum=0), "keepActive": _BOOL,
         "overrule-shutdown": _BOOL}  # fmt: skip


def _verify_vmid_list(value: str) -> None:
    """PVE::JSONSchema pve-vmid-list: vmids split like PVE::Tools::split_list."""
    for vmid in split_list(value):
        verify_vmid(vmid)


_VMS = Prop(format=_verify_vmid_list)
# pve-manager Nodes.pm: startall {force, vms}; stopall {vms, force-stop (default 1),
# timeout (default 180, 0..7200)}
_STARTALL = {"force": _BOOL, "vms": _VMS}
_STOPALL = {"vms": _VMS, "force-stop": _BOOL,
            "timeout": Prop(type="integer", minimum=0, maximum=2 * 3600)}  # fmt: skip

ROUTES: list[Route] = [
    Route("GET", "/version", get_version),
    Route("POST", "/nodes/{node}/startall", post_startall, _STARTALL),
    Route("POST", "/nodes/{node}/stopall", post_stopall, _STOPALL),
    Route("GET", "/nodes", get_nodes),
    Route("GET", "/nodes/{node}", get_node_index),
    Route("GET", "/nodes/{node}/tasks/{upid}/status", get_task_status),
]
for _kind in ("lxc", "qemu"):
    _base = f"/nodes/{{node}}/{_kind}"
    _upd = dict(cu.LXC_UPDATE_SCHEMA if _kind == "lxc" else cu.QEMU_UPDATE_SCHEMA)
    _create = {
        **{k: v for k, v in _upd.items() if k not in ("delete", "revert", "digest")},
        **CREATE_EXTRA[_kind],
    }
    ROUTES += [
        Route("GET", _base, list_guests(_kind), {"full": _BOOL} if _kind == "qemu" else {}),
        Route("POST", _base, create_guest(_kind), _create),
        Route("GET", f"{_base}/{{vmid}}", guest_index(_kind)),
        Route("DELETE", f"{_base}/{{vmid}}", delete_guest(_kind), {"purge": _BOOL, "force": _BOOL}),
        Route("GET", f"{_base}/{{vmid}}/config", get_config(_kind), _CONFIG_GET),
        Route("PUT", f"{_base}/{{vmid}}/config", put_config(_kind), _upd),
        Route("GET", f"{_base}/{{vmid}}/pending", get_pending(_kind)),
        Route("GET", f"{_base}/{{vmid}}/status", get_status_index),
        Route("GET", f"{_base}/{{vmid}}/status/current", get_status_current(_kind)),
        Route("POST", f"{_base}/{{vmid}}/status/start", post_status(_kind, "start"), _START),
        Route("POST", f"{_base}/{{vmid}}/status/stop", post_status(_kind, "stop"), _STOP),
    ]
ROUTES.append(Route("POST", "/nodes/{node}/qemu/{vmid}/config", post_qemu_config,
                    dict(cu.QEMU_UPDATE_SCHEMA)))  # fmt: skip


def find_route(method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    path = "/" + path.strip("/")
    for route in ROUTES:
        if route.method == method:
            found = route.match(path)
            if found is not None:
                return route, found
    return None


def path_exists(path: str) -> bool:
    return any(r.match("/" + path.strip("/")) is not None for r in ROUTES)


def call(root: Path, method: str, path: str, params: dict[str, str]) -> Result:
    """Run one API call; params are validated against the route's schema (HTTP 400)."""
    found = find_route(method, path)
    if found is None:
        raise PveError(f"Method '{method} {path}' not implemented", code=501)
    route, path_params = found
    if route.handler not in _SELF_VALIDATING:
        validate(params, route.params)
    return route.handler(root, path_params, params)


# PUT/POST config and create validate themselves (they have extra rules around the schema)
_SELF_VALIDATING: set[Handler] = set()
for _route in ROUTES:
    if _route.method in ("PUT", "POST") and (
        _route.pattern.endswith("/config") or _route.pattern.endswith(("/lxc", "/qemu"))
    ):
        _SELF_VALIDATING.add(_route.handler)
