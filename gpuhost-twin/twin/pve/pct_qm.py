"""pct and qm: config, pending, set, start, stop, status, list, exec (pct.pm / qm.pm output,
docs/reference/formats.md §2-§3; stdlib only)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import api_handlers, routes
from . import config as cfg
from . import config_update as cu
from . import runtime as rt
from .clihandler import _BOOL, Output, _abort, get_options
from .ctpush import push_lxc
from .schema import Prop, PveError


def _perl_num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _print_config(data: dict[str, object], out: Output) -> None:
    """pct/qm config: sorted `key: value`, description encoded, raw lxc.* pairs last."""
    for key in sorted(data):
        if key in ("digest", "lxc"):
            continue
        value = data[key]
        if key == "description":
            value = cfg.encode_text(str(value))
        out.out(f"{key}: {value}")
    for key, value in data.get("lxc", []):  # type: ignore[union-attr]
        out.out(f"{key}: {value}")


def _print_pending(items: list[dict[str, object]], out: Output) -> None:
    """PVE::GuestHelpers::format_pending."""
    for item in sorted(items, key=lambda i: str(i["key"])):
        key, value, pending = item["key"], item.get("value"), item.get("pending")
        if key == "description":
            value = cfg.encode_text(str(value)) if value is not None else None
            pending = cfg.encode_text(str(pending)) if pending is not None else None
        if value is not None:
            if item.get("delete"):
                out.out(f"del {key}: {value}")
            elif pending is not None:
                out.out(f"cur {key}: {value}")
                out.out(f"new {key}: {pending}")
            else:
                out.out(f"cur {key}: {value}")
        elif pending is not None:
            out.out(f"new {key}: {pending}")


def _relay(answer: dict[str, object], out: Output) -> None:
    """Pass the supervisor's output through unchanged."""
    out.stdout.append(str(answer.get("stdout") or ""))
    out.stderr.append(str(answer.get("stderr") or ""))


_CONFIG_OPTS = {"current": _BOOL, "snapshot": Prop()}


def guest_tool(kind: str, root: Path, argv: list[str], out: Output) -> int:
    tool = "pct" if kind == "lxc" else "qm"
    node = cfg.node_name(root)
    base = f"/nodes/{node}/{kind}"
    if not argv:
        return _abort(tool, "no command specified", out)
    cmd, args = argv[0], argv[1:]
    usage = f"{tool} {cmd} <vmid> [OPTIONS]\n"

    def opts(schema: dict[str, Prop], arg_params: list[str] | None = None) -> dict[str, str]:
        return get_options(schema, args, ["vmid"] if arg_params is None else arg_params, usage, out)

    try:
        if cmd == "list":
            usage = f"{tool} list{' [OPTIONS]' if kind == 'qemu' else ''}\n"
            params = opts({"full": _BOOL} if kind == "qemu" else {}, [])
            rows = sorted(routes.call(root, "GET", base, params).data, key=lambda d: d["vmid"])  # type: ignore[arg-type]
            _print_list(kind, rows, out)
        elif cmd == "config":
            params = opts(_CONFIG_OPTS)
            vmid = params.pop("vmid")
            _print_config(routes.call(root, "GET", f"{base}/{vmid}/config", params).data, out)  # type: ignore[arg-type]
        elif cmd == "pending":
            usage = f"{tool} pending <vmid>\n"
            vmid = opts({})["vmid"]
            _print_pending(routes.call(root, "GET", f"{base}/{vmid}/pending", {}).data, out)  # type: ignore[arg-type]
        elif cmd == "set":
            schema = cu.LXC_UPDATE_SCHEMA if kind == "lxc" else cu.QEMU_UPDATE_SCHEMA
            params = opts(schema)
            vmid = params.pop("vmid")
            res = routes.call(root, "PUT", f"{base}/{vmid}/config", params)
            for line in res.stdout:
                out.out(line)
            for line in res.warnings:
                out.err(line)
        elif cmd == "create":
            route = routes.find_route("POST", base)
            assert route is not None
            schema = {k: v for k, v in route[0].params.items() if k != "vmid"}
            usage = f"{tool} create <vmid>{' <ostemplate>' if kind == 'lxc' else ''} [OPTIONS]\n"
            params = opts(schema, ["vmid", "ostemplate"] if kind == "lxc" else ["vmid"])
            routes.call(root, "POST", base, params)
        elif cmd == "destroy":
            params = opts({"purge": _BOOL, "force": _BOOL})
            vmid = params.pop("vmid")
            routes.call(root, "DELETE", f"{base}/{vmid}", params)
        elif cmd == "status":
            params = opts({"verbose": _BOOL})
            data = routes.call(root, "GET", f"{base}/{params['vmid']}/status/current", {}).data
            out.out(f"status: {data['status']}")  # type: ignore[index]
        elif cmd in ("start", "stop"):
            params = opts(routes._START if cmd == "start" else routes._STOP)
            return _start_stop(kind, cmd, root, int(_vmid_of(params["vmid"])), out)
        elif cmd == "push" and kind == "lxc":
            usage = "pct push <vmid> <file> <destination> [OPTIONS]\n"
            schema = {"perms": Prop(), "user": Prop(), "group": Prop()}
            params = opts(schema, ["vmid", "file", "destination"])
            answer = push_lxc(
                root,
                int(_vmid_of(params["vmid"])),
                # pve-container src/PVE/CLI/pct.pm push: sysopen($file) in pct's own working
                # directory, so a relative source is the caller's (here, the twin's: its chroot)
                os.path.join(os.getcwd(), params["file"]),
                params["destination"],
                params.get("perms"),
            )
            _relay(answer, out)
            return 0 if answer.get("rc") == 0 else 255
        elif cmd == "exec" and kind == "lxc":
            usage = "pct exec <vmid> [<extra-args>]\n"
            params = opts({}, ["vmid", "extra-args"])
            argv_in = json.loads(params["extra-args"])
            vmid = int(_vmid_of(params["vmid"]))
            if not argv_in:
                cfg.load_config(root, "lxc", vmid)
                raise PveError("missing command")
            answer = rt.exec_lxc(root, vmid, argv_in, None)
            _relay(answer, out)
            return int(answer.get("rc", 1))  # type: ignore[call-overload]
        else:
            return _abort(tool, f"unknown command '{tool} {cmd}'", out)
    except PveError as exc:
        if exc.code == 400 and exc.usage is None:
            exc.usage = usage
        out.err(exc.text().removesuffix("\n"))
        return 255
    return 0


def _vmid_of(text: str) -> str:
    return str(api_handlers.vmid_of({"vmid": text}))


def _start_stop(kind: str, cmd: str, root: Path, vmid: int, out: Output) -> int:
    if kind == "qemu":
        if cmd == "start":
            rt.start_qemu(root, vmid, hook_log=out.out)
        else:
            rt.stop_qemu(root, vmid)
        return 0
    answer = (rt.start_lxc if cmd == "start" else rt.stop_lxc)(root, vmid, log=out.out)
    _relay(answer, out)
    return 0 if answer.get("rc") == 0 else 255  # upid_exit: exit(-1) on task failure


def _print_list(kind: str, rows: list[dict[str, object]], out: Output) -> None:
    if not rows:
        return  # both tools print nothing at all (no header) without guests
    if kind == "lxc":
        # pct.pm: printf("%-10s %-10s %-12s %-20s\n", ...)
        out.out(f"{'VMID':<10} {'Status':<10} {'Lock':<12} {'Name':<20}")
        for d in rows:
            out.out(
                f"{d['vmid']!s:<10} {d['status']!s:<10} {d.get('lock', '')!s:<12} {d['name']!s:<20}"
            )
        return
    # qm.pm: printf("%10s %-20s %-10s %-10s %12s %-10s\n", ...), disk "%12.2f"
    out.out(
        f"{'VMID':>10} {'NAME':<20} {'STATUS':<10} {'MEM(MB)':<10} {'BOOTDISK(GB)':>12} {'PID':<10}"
    )
    for d in rows:
        mem = _perl_num(int(d["maxmem"] or 0) / (1024 * 1024))  # type: ignore[call-overload]
        disk = int(d["maxdisk"] or 0) / (1024**3)  # type: ignore[call-overload]
        status = d.get("qmpstatus") or d["status"]
        pid = d.get("pid") or 0
        out.out(
            f"{d['vmid']!s:>10} {d['name']!s:<20} {status!s:<10} {mem:<10} {disk:12.2f} {pid!s:<10}"
        )
