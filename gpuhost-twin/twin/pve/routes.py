"""The slice of the Proxmox API tree the twin serves, shared by pvesh and the HTTPS API.

Paths, parameters and return shapes follow pve-manager/pve-container/qemu-server API2 modules
(docs/reference/formats.md §4): /version, /nodes, /nodes/{node}/{lxc,qemu}[/{vmid}[/config|/pending|/status/...]],
/nodes/{node}/tasks/{upid}/status. Handlers (api_handlers.py) return plain data; the caller wraps it
({"data": ...} over HTTPS, bare JSON from pvesh).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from . import access, mapping, tasks
from . import config_update as cu
from .api_handlers import (
    CREATE_EXTRA,
    Handler,
    Result,
    create_guest,
    delete_guest,
    delete_mapping,
    get_config,
    get_mapping,
    get_mappings,
    get_node_index,
    get_nodes,
    get_pending,
    get_status_current,
    get_status_index,
    get_task_log,
    get_task_status,
    get_version,
    guest_index,
    list_guests,
    post_mapping,
    post_qemu_config,
    put_config,
    put_mapping,
)
from .api_power import post_startall, post_status, post_stopall
from .schema import ParamError, Prop, PveError, split_list, validate, verify_configid, verify_vmid


@dataclass(frozen=True)
class Route:
    method: str
    pattern: str  # with {name} placeholders
    handler: Handler
    params: dict[str, Prop] = field(default_factory=dict)
    # the method's `permissions => {check => ['perm', PATH, PRIVS, any => 1]}`, checked before
    # the handler runs; None: `user => 'all'` (the handler checks what it needs itself)
    perm: tuple[str, tuple[str, ...], bool] | None = None

    def match(self, path: str) -> dict[str, str] | None:
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.pattern))
        m = re.fullmatch(regex, path)
        return m.groupdict() if m else None


_BOOL = Prop(type="boolean")
_CONFIG_GET = {"current": _BOOL, "snapshot": Prop(format=verify_configid)}
_START = {"skiplock": _BOOL, "debug": _BOOL, "timeout": Prop(type="integer", minimum=0)}
_STOP = {"skiplock": _BOOL, "timeout": Prop(type="integer", minimum=0), "keepActive": _BOOL,
         "overrule-shutdown": _BOOL}  # fmt: skip
_SHUTDOWN = {
    "qemu": {"skiplock": _BOOL, "timeout": Prop(type="integer", minimum=0), "keepActive": _BOOL,
             "forceStop": _BOOL},
    "lxc": {"timeout": Prop(type="integer", minimum=0), "forceStop": _BOOL},
}  # fmt: skip
_REBOOT = {"timeout": Prop(type="integer", minimum=0)}
# qemu-server / pve-container $vm_config_perm_list: PUT/POST config need any one of them
_CONFIG_PRIVS = ("VM.Config.Disk", "VM.Config.CDROM", "VM.Config.CPU", "VM.Config.Memory",
                 "VM.Config.Network", "VM.Config.HWType", "VM.Config.Options",
                 "VM.Config.Cloudinit")  # fmt: skip
_AUDIT = ("/vms/{vmid}", ("VM.Audit",), False)
_POWER = ("/vms/{vmid}", ("VM.PowerMgmt",), False)
_ALLOCATE = ("/vms/{vmid}", ("VM.Allocate",), False)
_CONFIGURE = ("/vms/{vmid}", _CONFIG_PRIVS, True)


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
    Route("GET", "/nodes/{node}/tasks/{upid}/log", get_task_log,
          {"start": Prop(type="integer", minimum=0), "limit": Prop(type="integer", minimum=0)}),
    Route("GET", "/cluster/mapping/pci", get_mappings, {"check-node": Prop()}),
    Route("POST", "/cluster/mapping/pci", post_mapping,
          {**mapping.CREATE_SCHEMA, "map": Prop(extra={"array": True})}),
    Route("GET", "/cluster/mapping/pci/{id}", get_mapping),
    Route("PUT", "/cluster/mapping/pci/{id}", put_mapping,
          {**mapping.UPDATE_SCHEMA, "map": Prop(extra={"array": True})}),
    Route("DELETE", "/cluster/mapping/pci/{id}", delete_mapping),
]  # fmt: skip
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
        Route("DELETE", f"{_base}/{{vmid}}", delete_guest(_kind), {"purge": _BOOL, "force": _BOOL},
              _ALLOCATE),
        Route("GET", f"{_base}/{{vmid}}/config", get_config(_kind), _CONFIG_GET, _AUDIT),
        Route("PUT", f"{_base}/{{vmid}}/config", put_config(_kind), _upd, _CONFIGURE),
        Route("GET", f"{_base}/{{vmid}}/pending", get_pending(_kind), {}, _AUDIT),
        Route("GET", f"{_base}/{{vmid}}/status", get_status_index),
        Route("GET", f"{_base}/{{vmid}}/status/current", get_status_current(_kind), {}, _AUDIT),
        Route("POST", f"{_base}/{{vmid}}/status/start", post_status(_kind, "start"), _START,
              _POWER),
        Route("POST", f"{_base}/{{vmid}}/status/stop", post_status(_kind, "stop"), _STOP, _POWER),
        Route("POST", f"{_base}/{{vmid}}/status/shutdown", post_status(_kind, "shutdown"),
              _SHUTDOWN[_kind], _POWER),
        Route("POST", f"{_base}/{{vmid}}/status/reboot", post_status(_kind, "reboot"), _REBOOT,
              _POWER),
    ]  # fmt: skip
ROUTES.append(Route("POST", "/nodes/{node}/qemu/{vmid}/config", post_qemu_config,
                    dict(cu.QEMU_POST_SCHEMA), _CONFIGURE))  # fmt: skip


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


Params = dict[str, "str | list[str]"]
_LIST_FORMATS = {"delete", "revert", "vms"}  # '-list' formats: repeated keys are joined


def call(root: Path, method: str, path: str, params: Params, user: str = access.ROOT,
         background: bool = False) -> Result:  # fmt: skip
    """Run one API call as ``user`` (root@pam: pvesh/qm; a token id over HTTPS). Permissions
    (403) come first, then the route's schema (400); ``background`` runs tasks in threads."""
    found = find_route(method, path)
    if found is None:
        raise PveError(f"Method '{method} {path}' not implemented", code=501)
    route, path_params = found
    token = access.set_caller(user)
    try:
        if route.perm is not None:
            where, privs, any_of = route.perm
            for name, value in path_params.items():
                where = where.replace("{" + name + "}", value)
            access.check(root, where, list(privs), any_of=any_of)
        flat = _normalize(params, keep_arrays=route.handler in _ARRAY_PARAMS)
        if route.handler not in _SELF_VALIDATING:
            validate(flat, route.params)  # type: ignore[arg-type]
        if background:
            with tasks.background():
                return route.handler(root, path_params, flat)  # type: ignore[arg-type]
        return route.handler(root, path_params, flat)  # type: ignore[arg-type]
    finally:
        access.reset_caller(token)


def _normalize(params: Params, keep_arrays: bool) -> Params:
    """RESTHandler $normalize_legacy_param_formats: a repeated key is joined for '-list'
    formats, kept for array properties (`map`), a type error anywhere else."""
    out: Params = {}
    errors = {}
    for key, value in params.items():
        if isinstance(value, list):
            if key in _LIST_FORMATS:
                value = ",".join(value)
            elif not (keep_arrays and key == "map"):
                errors[key] = "type check ('string') failed - got ARRAY"
        out[key] = value
    if errors:
        raise ParamError(errors)
    return out


_ARRAY_PARAMS: set[Handler] = {post_mapping, put_mapping}
# the mapping handlers validate themselves (`map` is an array)
_SELF_VALIDATING: set[Handler] = {post_mapping, put_mapping}


# PUT/POST config and create validate themselves (they have extra rules around the schema)
for _route in ROUTES:
    if _route.method in ("PUT", "POST") and (
        _route.pattern.endswith("/config") or _route.pattern.endswith(("/lxc", "/qemu"))
    ):
        _SELF_VALIDATING.add(_route.handler)
