"""Which privilege a guest config change needs (stdlib only).

qemu-server API2/Qemu.pm: `$check_vm_modify_config_perm` (option groups → VM.Config.CPU,
.Memory, .HWType, .Options, .Disk, .Network, .Cloudinit, VM.PowerMgmt; anything else is
root-only: "only root can set 'X' config"), `check_hostpci_perm` (host= is root-only, even to
delete or replace it; mapping= needs Mapping.Use on /mapping/pci/<id> and VM.Config.HWType;
romfile is a root-only parameter), serial and usb checks. pve-container PVE/LXC.pm
`check_ct_modify_config_perm` (devN is root-only: 403 "configuring device passthrough is only
allowed for root@pam"). The twin checks drives (ide/sata/scsi/virtio/efidisk/tpmstate) as
VM.Config.Disk only; storage privileges are not modelled.
"""

from __future__ import annotations

import re
from pathlib import Path

from . import access
from . import options as opts
from .schema import FormatError, ParamError, PveError, parse_property_string

_CPU = {"cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus"}
_MEMORY = {"memory", "balloon", "shares"}
_HWTYPE = {"acpi", "hotplug", "kvm", "machine", "runningmachine", "scsihw", "smbios1", "tablet",
           "vga", "watchdog", "audio0", "rng0"}  # fmt: skip
_GENERAL = {"agent", "autostart", "bios", "description", "keyboard", "localtime",
            "migrate_downtime", "migrate_speed", "name", "onboot", "ostype", "protection",
            "reboot", "startdate", "startup", "tdf", "template"}  # fmt: skip
_DISKOPTS = {"boot", "bootdisk", "vmstatestorage"}
_CLOUDINIT = {"cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver",
              "searchdomain", "sshkeys"}  # fmt: skip
_DRIVE = re.compile(r"(ide[0-3]|sata[0-5]|scsi([0-9]|[1-2][0-9]|30)|virtio([0-9]|1[0-5])|"
                    r"efidisk0|tpmstate0)")  # fmt: skip


def check_qemu_options(root: Path, vmid: int, keys: list[str]) -> None:
    """$check_vm_modify_config_perm (before the worker; value-dependent keys are skipped)."""
    if access.caller() == access.ROOT:
        return
    path = f"/vms/{vmid}"
    for opt in keys:
        if opt == "cdrom" or re.fullmatch(r"(unused|serial|usb|hostpci|virtiofs)\d+", opt):
            continue
        if _DRIVE.fullmatch(opt):
            access.check(root, path, ["VM.Config.Disk"])
        elif opt == "tags":
            access.check(root, path, ["VM.Config.Options"])  # assert_tag_permissions, simplified
        elif opt in _CPU or re.fullmatch(r"numa\d+", opt):
            access.check(root, path, ["VM.Config.CPU"])
        elif opt in _MEMORY:
            access.check(root, path, ["VM.Config.Memory"])
        elif opt in _HWTYPE:
            access.check(root, path, ["VM.Config.HWType"])
        elif opt in _GENERAL:
            access.check(root, path, ["VM.Config.Options"])
            if opt == "startup":  # it changes host behaviour
                access.check(root, "/", ["Sys.Modify"])
        elif opt == "freeze":
            access.check(root, path, ["VM.PowerMgmt"])
        elif opt in _DISKOPTS:
            access.check(root, path, ["VM.Config.Disk"])
        elif re.fullmatch(r"net\d+", opt):
            access.check(root, path, ["VM.Config.Network"])
        elif opt in _CLOUDINIT or re.fullmatch(r"ipconfig\d+", opt):
            access.check(root, path, ["VM.Config.Cloudinit", "VM.Config.Network"], any_of=True)
        elif opt == "vmstate":
            access.check(root, path, ["VM.Config.Disk", "VM.PowerMgmt"])
        else:
            raise PveError(f"only root can set '{opt}' config")


def check_hostpci(root: Path, vmid: int, opt: str, value: str) -> None:
    """check_hostpci_perm (inside the worker, for the new value and for the one it replaces)."""
    if access.caller() == access.ROOT:
        return
    try:
        device = parse_property_string(opts.HOSTPCI_FMT, value)
    except FormatError:
        device = {}
    if device.get("host"):
        raise PveError(f"only root can set '{opt}' config for non-mapped devices")
    if device.get("mapping"):
        access.check(root, f"/mapping/pci/{device['mapping']}", ["Mapping.Use"])
        access.check(root, f"/vms/{vmid}", ["VM.Config.HWType"])
    else:
        raise PveError("either 'host' or 'mapping' must be set.")
    if "romfile" in device:
        raise ParamError({opt: "only root@pam can set 'romfile' option"})


def check_serial_usb(root: Path, vmid: int, opt: str, value: str, delete: bool) -> None:
    """The serial/usb parts of update_vm_api: a socket serial or a spice/mapped usb port needs
    VM.Config.HWType (mapped usb also Mapping.Use); real devices are root-only."""
    if access.caller() == access.ROOT:
        return
    if opt.startswith("serial"):
        if value == "socket":
            access.check(root, f"/vms/{vmid}", ["VM.Config.HWType"])
            return
        word = "delete" if delete else "set"
        raise PveError(f"only root can {word} '{opt}' config for real devices")
    access.check(root, f"/vms/{vmid}", ["VM.Config.HWType"])
    host = re.search(r"(?:^|,)(?:host=)?([^,=]+)(?:,|$)", value)
    mapped = re.search(r"(?:^|,)mapping=([^,]+)", value)
    if mapped:
        access.check(root, f"/mapping/usb/{mapped.group(1)}", ["Mapping.Use"])
    elif host and host.group(1).lower() != "spice":
        raise PveError(f"only root can set '{opt}' config for real devices")


def check_lxc_options(root: Path, vmid: int, keys: list[str], deletes: list[str]) -> None:
    """check_ct_modify_config_perm, without the storage and feature-flag details."""
    if access.caller() == access.ROOT:
        return
    path = f"/vms/{vmid}"
    for opt in [*keys, *deletes]:
        if opt in ("cores", "cpuunits", "cpulimit"):
            access.check(root, path, ["VM.Config.CPU"])
        elif opt == "rootfs" or re.fullmatch(r"mp\d+", opt):
            access.check(root, path, ["VM.Config.Disk"])
        elif opt in ("memory", "swap"):
            access.check(root, path, ["VM.Config.Memory"])
        elif re.fullmatch(r"net\d+", opt) or opt in ("nameserver", "searchdomain", "hostname"):
            access.check(root, path, ["VM.Config.Network"])
        elif re.fullmatch(r"dev\d+", opt):
            raise access.perm_error("configuring device passthrough is only allowed for root@pam")
        elif opt == "hookscript":
            raise access.perm_error("changing the hookscript is only allowed for root@pam")
        elif opt == "features":
            raise access.perm_error("changing feature flags (except nesting) is only allowed "
                                    "for root@pam")  # fmt: skip
        else:
            access.check(root, path, ["VM.Config.Options"])
