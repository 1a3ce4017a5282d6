"""Entry points of the twin's Proxmox tools: pct, qm, pvesh, proxmox-boot-tool, update-grub,
update-initramfs (stdlib only; installed into the twin by twin.pve.install).

Argument handling mirrors pve-common PVE::JSONSchema::get_options / PVE::CLIHandler:
`-opt value`, `--opt value`, `--opt=value`, booleans with an optional value, positional
arguments, and the same failure texts ("Unknown option: foo" + "400 unable to parse option",
"400 Parameter verification failed." + one line per parameter, then the short usage). Output
formats are pct.pm / qm.pm / pvesh's (formats.md §2-§4).

The twin's root comes from $TWIN_ROOT (default "/"), so tests can run the tools on a directory.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from . import bootloader as bl
from . import config as cfg
from . import routes
from . import runtime as rt
from .schema import ParamError, Prop, PveError, parse_boolean


class Output:
    """stdout/stderr of one tool run (kept apart so tests can check both)."""

    def __init__(self) -> None:
        self.stdout: list[str] = []  # chunks, newlines included
        self.stderr: list[str] = []

    def out(self, line: str) -> None:
        self.stdout.append(line + "\n")

    def err(self, line: str) -> None:
        self.stderr.append(line + "\n")

    def take(self, bo: bl.Out) -> None:
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


# --- pct / qm ---

_BOOL = Prop(type="boolean")
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
            schema = rt.LXC_UPDATE_SCHEMA if kind == "lxc" else rt.QEMU_UPDATE_SCHEMA
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
    return str(routes._vmid({"vmid": text}))


def _start_stop(kind: str, cmd: str, root: Path, vmid: int, out: Output) -> int:
    if kind == "qemu":
        (rt.start_qemu if cmd == "start" else rt.stop_qemu)(root, vmid)
        return 0
    answer = (rt.start_lxc if cmd == "start" else rt.stop_lxc)(root, vmid)
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


def _abort(tool: str, reason: str, out: Output) -> int:
    out.err(f"ERROR: {reason}")
    out.err(f"USAGE: {tool} <COMMAND> [ARGS] [OPTIONS]")
    return 255


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


# --- proxmox-boot-tool / update-grub / update-initramfs ---


def _boot_usage(sub: str | None, out: bl.Out) -> None:
    tool = bl.TOOL
    if sub is None:
        out.err(f"USAGE: {tool} <commands> [ARGS]")
        out.err("")
    lines = {
        "format": [f"  {tool} format <partition> [--force]"],
        "init": [f"  {tool} init <partition> [grub]"],
        "reinit": [f"  {tool} reinit"],
        "clean": [f"  {tool} clean [--dry-run]"],
        "refresh": [f"  {tool} refresh [--hook <name>]"],
        "kernel": [
            f"  {tool} kernel <add|remove> <kernel-version>",
            f"  {tool} kernel pin <kernel-version> [--next-boot]",
            f"  {tool} kernel unpin [--next-boot]",
            f"  {tool} kernel list",
        ],
        "status": [f"  {tool} status [--quiet]"],
        "help": [f"  {tool} help"],
    }
    for name, text in lines.items():
        if sub is None or sub == name:
            for line in text:
                out.err(line)


def boot_tool(root: Path, argv: list[str], out: Output) -> int:
    bo = bl.Out()
    try:
        rc = _boot_tool(root, argv, bo)
    except bl.Exit as exc:
        rc = exc.rc
    out.take(bo)
    return rc


def _boot_tool(root: Path, argv: list[str], bo: bl.Out) -> int:
    if not argv:
        _boot_usage(None, bo)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("format", "init", "reinit", "clean"):
        bo.err(f"E: '{cmd}' is not simulated by the gpuhost twin (ESPs are set up by its profile)")
        return 1
    if cmd == "refresh":
        if not rest:
            bl.refresh(root, bo)
        elif len(rest) == 2 and rest[0] == "--hook":
            bl.refresh(root, bo, rest[1])
        else:
            _boot_usage("refresh", bo)
            return 1
        return 0
    if cmd in ("kernel", "kernels"):
        if not rest:
            bo.err("E: subcommand is mandatory for 'kernel'.")
            bo.err("")
            _boot_usage("kernel", bo)
            return 1
        sub, nargs = rest[0], len(rest)
        arg = rest[1] if nargs > 1 else ""
        if sub == "add":
            bl.add_kernel(root, bo, arg)
        elif sub == "remove":
            bl.remove_kernel(root, bo, arg)
        elif sub == "list":
            bl.list_kernels(root, bo)
        elif sub == "pin" and nargs == 3 and rest[2] == "--next-boot":
            bl.pin_kernel(root, bo, arg, next_boot=True)
            bo.out("Pinned for next boot only.")
        elif sub == "pin" and nargs == 2:
            bl.pin_kernel(root, bo, arg, next_boot=False)
        elif sub == "unpin" and nargs == 2 and rest[1] == "--next-boot":
            bl.unpin_kernel(root, bo, next_boot_only=True)
        elif sub == "unpin" and nargs == 1:
            bl.unpin_kernel(root, bo, next_boot_only=False)
        elif sub in ("pin", "unpin"):
            _boot_usage("kernel", bo)
            return 1
        else:
            bo.err(f"E: invalid 'kernel' subcommand '{sub}'.")
            bo.err("")
            _boot_usage("kernel", bo)
            return 1
        return 0
    if cmd == "status":
        if rest == ["--quiet"]:
            bl.status(root, bo, quiet=True)
        elif not rest:
            bl.status(root, bo, quiet=False)
        else:
            _boot_usage("status", bo)
            return 1
        return 0
    if cmd == "help":
        _boot_usage(None, bo)
        return 0
    bo.err(f"Invalid/unknown command '{cmd}'.")
    bo.err("")
    _boot_usage(None, bo)
    return 1


def update_grub(root: Path, argv: list[str], out: Output) -> int:
    bo = bl.Out()
    rc = 0
    try:
        bl.update_grub(root, bo)
    except bl.Exit as exc:
        rc = exc.rc
    out.take(bo)
    return rc


INITRAMFS_USAGE = "Usage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]"


def update_initramfs(root: Path, argv: list[str], out: Output) -> int:
    mode, version = None, None
    args = list(argv)
    while args:
        arg = args.pop(0)
        m = re.fullmatch(r"-k(.*)", arg)
        if m:
            version = m.group(1) or (args.pop(0) if args else None)
            if version is None:
                out.err(INITRAMFS_USAGE)
                return 2
        elif arg in ("-c", "-u", "-d"):
            mode = {"-c": "create", "-u": "update", "-d": "delete"}[arg]
        elif arg in ("-v", "-t"):
            continue
        elif arg == "-b":
            args = args[1:]
        else:
            out.err(INITRAMFS_USAGE)
            return 2
    if mode is None:
        out.err(INITRAMFS_USAGE)
        return 2
    if mode == "delete":
        targets = bl.installed_kernels(root) if version == "all" else [version or ""]
        for ver in targets:
            initrd = root / f"boot/initrd.img-{ver}"
            if initrd.exists():
                out.out(f"update-initramfs: Deleting /boot/initrd.img-{ver}")
                initrd.unlink()
        return 0
    bo = bl.Out()
    rc = 0
    try:
        bl.update_initramfs(root, bo, mode, version)
    except bl.Exit as exc:
        rc = exc.rc
    out.take(bo)
    return rc


def kernel_hook(root: Path, argv: list[str], out: Output) -> int:
    """argv: <phase> <hook name> <version> [<image>] (run-parts passes version and image)."""
    phase, name, version = [*argv, "", "", ""][:3]
    bo = bl.Out()
    rc = 0
    try:
        bl.kernel_hook(root, bo, phase, name, version)
    except bl.Exit as exc:
        rc = exc.rc
    out.take(bo)
    return rc


# --- dispatch ---

TOOLS: dict[str, Callable[[Path, list[str], Output], int]] = {
    "pct": lambda root, argv, out: guest_tool("lxc", root, argv, out),
    "qm": lambda root, argv, out: guest_tool("qemu", root, argv, out),
    "pvesh": pvesh,
    "proxmox-boot-tool": boot_tool,
    "update-grub": update_grub,
    "update-initramfs": update_initramfs,
    "kernel-hook": kernel_hook,
}


def run(tool: str, argv: list[str], root: Path | None = None) -> tuple[int, str, str]:
    """Run one tool in-process: (exit status, stdout, stderr)."""
    root = root if root is not None else Path(os.environ.get("TWIN_ROOT", "/"))
    out = Output()
    cfg.drain_warnings()
    rc = TOOLS[tool](root, argv, out)
    warnings = "".join(f"{w}\n" for w in cfg.drain_warnings())  # perl warns while parsing
    return rc, "".join(out.stdout), warnings + "".join(out.stderr)


def main(tool: str, argv: list[str] | None = None) -> int:
    rc, stdout, stderr = run(tool, sys.argv[1:] if argv is None else argv)
    sys.stdout.write(stdout)
    sys.stdout.flush()
    sys.stderr.write(stderr)
    return rc
