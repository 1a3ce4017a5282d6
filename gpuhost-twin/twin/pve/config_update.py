"""Guest config changes: pct set / qm set / PUT .../config (stdlib only).

They follow pve-container update_pct_config / vmconfig_hotplug_pending / vmconfig_apply_pending
and qemu-server's update_vm_api: every change first goes to the pending section, then is applied
at once when the guest is stopped (or for options that can change live), otherwise it stays
pending until the next start."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import access, guest_perms, hookscript, lxc_devices
from . import config as cfg
from . import options as opts
from .guest_state import (
    config_lock,
    guest_word,
    is_running,
    supervisor_request,
)
from .schema import (
    FormatError,
    ParamError,
    Prop,
    PveError,
    parse_property_string,
    split_list,
    validate,
    verify_configid_list,
)

# pve-container $LXC_FASTPLUG_OPTIONS: applied at once even while the guest runs
LXC_FASTPLUG = {"description", "onboot", "startup", "protection", "hostname", "hookscript",
                "cores", "tags", "lock"}  # fmt: skip


LXC_HOTPLUG = {"cpulimit", "cpuunits", "memory", "swap"}  # cgroup changes on a live CT


# qemu-server $fast_plug_option plus the cloud-init options: applied at once on a running VM.
# What QEMU would hot-plug (net, disks, usb, cpu, memory with `hotplug`) stays pending in the
# twin, which runs no QEMU; hostpciN and machine stay pending on a real VM too.
QEMU_FASTPLUG = {"description", "hookscript", "lock", "migrate_downtime", "migrate_speed", "name",
                 "onboot", "protection", "shares", "startup", "tags", "vmstatestorage",
                 "cicustom", "cipassword", "citype", "ciupgrade", "ciuser", "nameserver",
                 "searchdomain", "sshkeys"}  # fmt: skip


# docs/reference/formats.md §1: on PVE 8 a devN set on a running CT waits in [pve:pending] for the next start.
# PVE 9 (pve-container 6.0.4+, c702167 "implement device hotplug") hotplugs a new devN into the
# running CT; a changed or removed one still waits (Config.pm vmconfig_hotplug_pending).
HOTPLUG_NEW_LXC_DEVICES_FROM = 9


COMMON_UPDATE = {
    "delete": Prop(format=verify_configid_list),
    "revert": Prop(format=verify_configid_list),
    "digest": Prop(max_length=40),  # pve-common Tools.pm: a SHA-1 in hex
}


LXC_UPDATE_SCHEMA: dict[str, Prop] = {
    **{k: v for k, v in opts.LXC_OPTIONS.items() if k not in opts.SNAPSHOT_ONLY},
    **COMMON_UPDATE,
}


QEMU_UPDATE_SCHEMA: dict[str, Prop] = {
    **{k: v for k, v in opts.QEMU_OPTIONS.items() if k not in opts.SNAPSHOT_ONLY},
    **COMMON_UPDATE,
    "skiplock": Prop(type="boolean"),
    "force": Prop(type="boolean"),
}
# POST .../config only (Qemu.pm update_vm_async): wait up to N s for the worker
QEMU_POST_SCHEMA: dict[str, Prop] = {
    **QEMU_UPDATE_SCHEMA,
    "background_delay": Prop(type="integer", minimum=1, maximum=30),
}


# --- config updates (pct set / qm set / PUT .../config) ---


@dataclass
class UpdateResult:
    stdout: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _cleanup_pending(conf: cfg.GuestConfig) -> None:
    """AbstractConfig::cleanup_pending: drop pending values equal to current ones."""
    deletes = cfg.pending_delete(conf)
    for key in list(conf.pending.values):
        if key == "delete":
            continue
        if conf.main.values.get(key) == conf.pending.values[key] or key in deletes:
            del conf.pending.values[key]
    cfg.set_pending_delete(conf, {k: f for k, f in deletes.items() if k in conf.main.values})


def _apply(conf: cfg.GuestConfig, keys: set[str] | None) -> None:
    """vmconfig_apply_pending for `keys` (None: everything)."""
    deletes = cfg.pending_delete(conf)
    for key in list(deletes):
        if keys is None or key in keys:
            conf.main.values.pop(key, None)
            del deletes[key]
    cfg.set_pending_delete(conf, deletes)
    for key in list(conf.pending.values):
        if key != "delete" and (keys is None or key in keys):
            conf.main.values[key] = conf.pending.values.pop(key)


def apply_pending(root: Path, kind: str, vmid: int) -> None:
    """What a start does first: apply every pending change (vm_start)."""
    with config_lock(root, kind, vmid):
        conf = cfg.load_config(root, kind, vmid)
        if conf.pending.values:
            _apply(conf, None)
            cfg.save_config(root, conf)


def _check_delete_list(schema_opts: dict[str, Prop], params: dict[str, str], deletes: list[str],
                       reverts: list[str]) -> None:  # fmt: skip
    for opt in reverts:
        if opt not in schema_opts:
            raise ParamError({"revert": f"unknown option '{opt}'"})
        if opt in params:
            raise ParamError(
                {"delete": f"you can't use '-{opt}' and -revert {opt}' at the same time"}
            )
    for opt in deletes:
        if opt in params:
            raise ParamError(
                {"delete": f"you can't use '-{opt}' and -delete {opt}' at the same time"}
            )
        if opt in reverts:
            raise ParamError(
                {"revert": f"you can't use '-delete {opt}' and -revert {opt}' at the same time"}
            )
        if opt not in schema_opts:
            raise ParamError({"delete": f"unknown option '{opt}'"})


def _device_mode_and_rdev(root: Path, path: str) -> None:
    """PVE::LXC::Tools::get_device_mode_and_rdev: the node must exist on the host now."""
    import stat as st

    try:
        mode = os.stat(root / path.lstrip("/")).st_mode
    except FileNotFoundError:
        raise PveError(f"Device {path} does not exist") from None
    if not (st.S_ISCHR(mode) or st.S_ISBLK(mode)):
        raise PveError(f"{path} is not a device")


def update_lxc(root: Path, vmid: int, params: dict[str, str]) -> UpdateResult:
    """PUT /nodes/{node}/lxc/{vmid}/config (pct set)."""
    params = dict(params)
    validate(params, LXC_UPDATE_SCHEMA)
    digest = params.pop("digest", None)
    deletes = split_list(params.pop("delete", ""))
    reverts = split_list(params.pop("revert", ""))
    if not deletes and not reverts and not params:
        raise PveError("no options specified")
    _check_delete_list(opts.LXC_OPTIONS, params, deletes, reverts)
    result = UpdateResult()
    with config_lock(root, "lxc", vmid):
        conf = cfg.load_config(root, "lxc", vmid)
        _check_lock_and_digest(conf, digest)
        guest_perms.check_lxc_options(root, vmid, list(params), deletes)
        running = is_running(root, "lxc", vmid)
        pend = cfg.pending_delete(conf)
        for opt in reverts:
            conf.pending.values.pop(opt, None)
            pend.pop(opt, None)
        for opt in deletes:
            if (
                opt not in conf.main.values
                and opt not in conf.pending.values
                and not (opt == "description" and conf.main.description is not None)
            ):
                result.warnings.append(f"cannot delete '{opt}' - not set in current configuration!")
                continue
            if opt in ("memory", "rootfs", "ostype"):
                raise PveError(f"unable to delete required option '{opt}'")
            if opt == "unprivileged":
                raise PveError(f"unable to delete read-only option: '{opt}'")
            if opt == "description":
                conf.main.description = None
                continue
            pend[opt] = False
        cfg.set_pending_delete(conf, pend)
        for opt in sorted(params):
            value = params[opt]
            if opt == "unprivileged":
                raise PveError(f"unable to modify read-only option: '{opt}'")
            if re.fullmatch(r"dev\d+", opt):
                device = lxc_devices.parse_device(value)
                _device_mode_and_rdev(root, device.path)
            if opt == "hookscript":  # pve-container Config.pm update_pct_config
                hookscript.resolve(root, value)
            if opt == "description":
                conf.main.description = value  # a fast-plug option: always applied at once
                continue
            conf.pending.values[opt] = value
            pend = cfg.pending_delete(conf)
            pend.pop(opt, None)
            cfg.set_pending_delete(conf, pend)
        _cleanup_pending(conf)
        if running:
            # what vmconfig_hotplug_pending changes on a live CT; the rest waits for a restart
            live = (
                LXC_FASTPLUG | LXC_HOTPLUG | {k for k in [*params, *deletes] if k.startswith("net")}
            )
            errors = []
            if cfg.pve_release(root) >= HOTPLUG_NEW_LXC_DEVICES_FROM:
                for key in sorted(k for k in params if re.fullmatch(r"dev\d+", k)):
                    if key in conf.main.values:
                        continue  # "don't try to hotplug over existing dev"
                    # the supervisor makes the node in the CT and allows it in the cgroup
                    request = {"op": "ct-hotplug-dev", "ctid": vmid, "value": params[key]}
                    done = supervisor_request(root, request)
                    if done.get("rc") == 0:
                        live.add(key)
                    else:  # stays pending; the API reports it (raise_param_exc)
                        errors.append(f"{key}: {str(done.get('stderr', '')).strip()}")
            _apply(conf, live)
            if errors:
                cfg.save_config(root, conf)
                raise PveError("\n".join(errors))
        else:
            _apply(conf, None)
        cfg.save_config(root, conf)
    return result


Fork = Callable[[Callable[[UpdateResult], None]], UpdateResult]


def update_qemu(
    root: Path, vmid: int, params: dict[str, str], fork: Fork | None = None
) -> UpdateResult:
    """PUT (fork=None: in the foreground) or POST .../config (qm set): update_vm_api.

    Parameter and generic permission errors, a missing VM, a digest mismatch and a lock are
    raised before the worker; hostpci permissions, hotplug and apply happen inside it."""
    params = dict(params)
    validate(params, QEMU_POST_SCHEMA if fork else QEMU_UPDATE_SCHEMA)
    paramarr = []
    for key in sorted(params):
        if key in ("digest", "background_delay"):
            continue
        value = "<hidden>" if key == "cipassword" else params[key]
        paramarr += [f"-{key}", value]
    digest = params.pop("digest", None)
    params.pop("background_delay", None)
    skiplock = params.pop("skiplock", None) == "1"
    if skiplock and access.caller() != access.ROOT:
        raise ParamError({"skiplock": "Only root may use this option."})
    params.pop("force", None)
    deletes = ["ide2" if d == "cdrom" else d for d in split_list(params.pop("delete", ""))]
    reverts = split_list(params.pop("revert", ""))
    if "cdrom" in params:
        params["ide2"] = params.pop("cdrom")
    if not deletes and not reverts and not params:
        raise PveError("no options specified")
    _check_delete_list(opts.QEMU_OPTIONS, params, deletes, reverts)
    guest_perms.check_qemu_options(root, vmid, deletes)
    guest_perms.check_qemu_options(root, vmid, list(params))
    with config_lock(root, "qemu", vmid):
        conf = cfg.load_config(root, "qemu", vmid)
        if digest and digest != conf.digest:
            raise PveError("checksum mismatch (file change by other user?)")
        lock = conf.main.values.get("lock")
        if lock and not skiplock:
            raise PveError(f"VM is locked ({lock})")

    def work(result: UpdateResult) -> None:
        with config_lock(root, "qemu", vmid):
            conf = cfg.load_config(root, "qemu", vmid)
            result.stdout.append(f"update VM {vmid}: " + " ".join(paramarr))
            _qemu_changes(root, conf, dict(params), list(deletes), reverts, result)
            cfg.save_config(root, conf)

    if fork is None:
        result = UpdateResult()
        work(result)
        return result
    return fork(work)


def _qemu_changes(root: Path, conf: cfg.GuestConfig, params: dict[str, str], deletes: list[str],
                  reverts: list[str], result: UpdateResult) -> None:  # fmt: skip
    vmid = conf.vmid
    running = is_running(root, "qemu", vmid)
    pend = cfg.pending_delete(conf)
    for opt in reverts:
        if opt in conf.main.values:
            params[opt] = conf.main.values[opt]
        elif opt in conf.pending.values:
            deletes.append(opt)
    for opt in deletes:
        if (
            opt not in conf.main.values
            and opt not in conf.pending.values
            and not (opt == "description" and conf.main.description is not None)
        ):
            result.warnings.append(f"cannot delete '{opt}' - not set in current configuration!")
            continue
        old = conf.pending.values.get(opt, conf.main.values.get(opt, ""))
        if re.fullmatch(r"hostpci\d+", opt):
            guest_perms.check_hostpci(root, vmid, opt, old)
        elif re.fullmatch(r"(serial|usb)\d+", opt):
            guest_perms.check_serial_usb(root, vmid, opt, old, delete=True)
        conf.pending.values.pop(opt, None)
        if opt == "description":
            conf.main.description = None
        elif opt in ("tags",) or opt.startswith("unused"):
            conf.main.values.pop(opt, None)
        else:
            pend[opt] = False
    cfg.set_pending_delete(conf, pend)
    for opt, value in params.items():
        if re.fullmatch(r"hostpci\d+", opt):
            if conf.main.values.get(opt):
                guest_perms.check_hostpci(root, vmid, opt, conf.main.values[opt])
            guest_perms.check_hostpci(root, vmid, opt, value)
        elif re.fullmatch(r"(serial|usb)\d+", opt):
            guest_perms.check_serial_usb(root, vmid, opt, value, delete=False)
        if opt == "machine":
            assert_valid_machine(value)
        if opt == "hookscript":  # qemu-server API2/Qemu.pm update_vm_api: raise_param_exc
            try:
                hookscript.resolve(root, value)
            except PveError as exc:
                raise ParamError({opt: exc.msg.rstrip("\n")}) from None
        if opt == "description":
            conf.main.description = value
            continue
        conf.pending.values[opt] = value
        pend = cfg.pending_delete(conf)
        pend.pop(opt, None)
        cfg.set_pending_delete(conf, pend)
    _cleanup_pending(conf)
    _apply(conf, QEMU_FASTPLUG if running else None)


def assert_valid_machine(value: str) -> None:
    """Machine.pm assert_valid_machine_property (on update, and again at start)."""
    try:
        machine = parse_property_string(opts.MACHINE_FMT, value)
    except FormatError:
        return  # the schema check reported it already
    if machine.get("viommu") == "intel" and "q35" not in machine.get("type", ""):
        raise PveError("to use Intel vIOMMU please set the machine type to q35")


def _check_lock_and_digest(conf: cfg.GuestConfig, digest: str | None) -> None:
    """pve-container update_pct_config: the lock first, then the digest."""
    lock = conf.main.values.get("lock")
    if lock:
        raise PveError(f"{guest_word(conf.kind)} is locked ({lock})")
    if digest and digest != conf.digest:
        raise PveError("detected modified configuration - file changed by other user? Try again.")
