"""The guest config options Proxmox accepts, with their formats (stdlib only): pve-container
$confdesc and $valid_lxc_conf_keys, qemu-server's options, $hostpci_fmt, $machine_fmt
(docs/reference/formats.md §1, §3). config.py parses and checks guest configs against them."""

from __future__ import annotations

from .schema import (
    STARTUP_FMT,
    Prop,
    accept_any,
    verify_configid,
    verify_disk_size,
    verify_dns_name,
    verify_lxc_dev_string,
    verify_lxc_mp_string,
    verify_tag_list,
    verify_volume_id,
)


def _bool(**kw: object) -> Prop:
    return Prop(type="boolean", **kw)  # type: ignore[arg-type]


def _int(**kw: object) -> Prop:
    return Prop(type="integer", **kw)  # type: ignore[arg-type]


# --- container options (pve-container $confdesc, master branch; see README note on PVE 8) ---

_MOUNT_OPT = r"(discard|lazytime|noatime|nodev|noexec|nosuid)"


ROOTFS_FMT: dict[str, Prop] = {
    "volume": Prop(optional=False, default_key=True, format=verify_lxc_mp_string),
    "size": Prop(format=verify_disk_size),
    "acl": _bool(),
    "mountoptions": Prop(pattern=rf"{_MOUNT_OPT}(;{_MOUNT_OPT})*"),
    "ro": _bool(),
    "quota": _bool(),
    "replicate": _bool(),
    "shared": _bool(),
}


MP_FMT: dict[str, Prop] = {
    **ROOTFS_FMT,
    "backup": _bool(),
    "mp": Prop(optional=False, format=verify_lxc_mp_string),
}


DEV_FMT: dict[str, Prop] = {
    "path": Prop(default_key=True, format=verify_lxc_dev_string),
    "mode": Prop(pattern=r"0[0-7]{3}"),
    "uid": _int(minimum=0),
    "gid": _int(minimum=0),
    "deny-write": _bool(),
}


LXC_NET_FMT: dict[str, Prop] = {
    "type": Prop(enum=("veth",)),
    "name": Prop(optional=False, pattern=r"[-_.\w\d]+"),
    "bridge": Prop(pattern=r"[-_.\w\d]+"),
    "hwaddr": Prop(format=accept_any),
    "mtu": _int(minimum=64, maximum=65535),
    "ip": Prop(format=accept_any),
    "gw": Prop(format=accept_any),
    "ip6": Prop(format=accept_any),
    "gw6": Prop(format=accept_any),
    "firewall": _bool(),
    "tag": _int(minimum=1, maximum=4094),
    "trunks": Prop(pattern=r"\d+(?:;\d+)*"),
    "rate": Prop(type="number"),
    "link_down": _bool(),
}


FEATURES_FMT: dict[str, Prop] = {
    "mount": Prop(pattern=r"[a-zA-Z0-9_; ]+"),
    "nesting": _bool(),
    "keyctl": _bool(),
    "fuse": _bool(),
    "mknod": _bool(),
    "force_rw_sys": _bool(),
}


UNUSED_FMT: dict[str, Prop] = {
    "volume": Prop(optional=False, default_key=True, format=verify_volume_id),
}


LXC_OPTIONS: dict[str, Prop] = {
    "lock": Prop(
        enum=tuple(
            "backup create destroyed disk fstrim migrate mounted rollback snapshot "
            "snapshot-delete".split()
        )
    ),
    "onboot": _bool(),
    "startup": Prop(format=STARTUP_FMT),
    "template": _bool(),
    "arch": Prop(enum=("amd64", "i386", "arm64", "armhf", "riscv32", "riscv64")),
    "ostype": Prop(
        enum=tuple(
            "debian devuan ubuntu centos fedora opensuse archlinux alpine gentoo nixos "
            "unmanaged".split()
        )
    ),
    "console": _bool(),
    "tty": _int(minimum=0, maximum=6),
    "cores": _int(minimum=1, maximum=8192),
    "cpulimit": Prop(type="number", minimum=0, maximum=8192),
    "cpuunits": _int(minimum=0, maximum=500000),
    "memory": _int(minimum=16),
    "swap": _int(minimum=0),
    "hostname": Prop(format=verify_dns_name, max_length=255),
    "description": Prop(max_length=8192),
    "ipmanagehost": _bool(),
    "searchdomain": Prop(format=accept_any),
    "nameserver": Prop(format=accept_any),
    "timezone": Prop(format=accept_any),
    "rootfs": Prop(format=ROOTFS_FMT),
    "parent": Prop(format=verify_configid, max_length=40),
    "snaptime": _int(minimum=0),
    "cmode": Prop(enum=("shell", "console", "tty")),
    "entrypoint": Prop(),
    "protection": _bool(),
    "unprivileged": _bool(),
    "features": Prop(format=FEATURES_FMT),
    "hookscript": Prop(format=verify_volume_id),
    "tags": Prop(format=verify_tag_list),
    "debug": _bool(),
}


LXC_OPTIONS.update({f"net{i}": Prop(format=LXC_NET_FMT) for i in range(32)})


LXC_OPTIONS.update({f"mp{i}": Prop(format=MP_FMT) for i in range(256)})


LXC_OPTIONS.update({f"unused{i}": Prop(format=UNUSED_FMT) for i in range(256)})


LXC_OPTIONS.update({f"dev{i}": Prop(format=DEV_FMT) for i in range(256)})


VALID_LXC_KEYS: dict[str, str | None] = {
    key: None
    for key in (
        "lxc.apparmor.profile lxc.apparmor.allow_incomplete lxc.apparmor.allow_nesting "
        "lxc.apparmor.raw lxc.selinux.context lxc.include lxc.arch lxc.uts.name "
        "lxc.signal.halt lxc.signal.reboot lxc.signal.stop lxc.init.cmd lxc.init.cwd "
        "lxc.pty.max lxc.console.logfile lxc.console.path lxc.tty.max lxc.devtty.dir "
        "lxc.hook.autodev lxc.autodev lxc.kmsg lxc.mount.fstab lxc.mount.entry lxc.mount.auto "
        "lxc.rootfs.mount lxc.cap.drop lxc.cap.keep lxc.seccomp.profile "
        "lxc.seccomp.notify.proxy lxc.seccomp.notify.cookie lxc.idmap lxc.hook.pre-start "
        "lxc.hook.pre-mount lxc.hook.mount lxc.hook.start lxc.hook.stop lxc.hook.post-stop "
        "lxc.hook.clone lxc.hook.destroy lxc.hook.version lxc.log.level lxc.log.file "
        "lxc.start.auto lxc.start.delay lxc.start.order lxc.group lxc.environment "
        "lxc.environment.runtime lxc.environment.hooks lxc.sysctl.fs.mqueue "
        "lxc.sysctl.kernel.msgmax lxc.sysctl.kernel.msgmnb lxc.sysctl.kernel.msgmni "
        "lxc.sysctl.kernel.sem lxc.sysctl.kernel.shmall lxc.sysctl.kernel.shmmax "
        "lxc.sysctl.kernel.shmmni lxc.sysctl.kernel.shm_rmid_forced"
    ).split()
}
VALID_LXC_KEYS["lxc.rootfs.path"] = "lxc.rootfs.path is auto generated from rootfs"
VALID_LXC_KEYS["lxc.rootfs.options"] = (
    'lxc.rootfs.options is not supported, please use mount point options in the "rootfs" key'
)
DEPRECATED_LXC_KEYS: dict[str, str] = {
    "lxc.aa_profile": "lxc.apparmor.profile",
    "lxc.aa_allow_incomplete": "lxc.apparmor.allow_incomplete",
    "lxc.console": "lxc.console.path",
    "lxc.devttydir": "lxc.tty.dir",
    "lxc.haltsignal": "lxc.signal.halt",
    "lxc.rebootsignal": "lxc.signal.reboot",
    "lxc.stopsignal": "lxc.signal.stop",
    "lxc.id_map": "lxc.idmap",
    "lxc.init_cmd": "lxc.init.cmd",
    "lxc.loglevel": "lxc.log.level",
    "lxc.logfile": "lxc.log.file",
    "lxc.mount": "lxc.mount.fstab",
    "lxc.network.type": "lxc.net.INDEX.type",
    "lxc.network.link": "lxc.net.INDEX.link",
    "lxc.pts": "lxc.pty.max",
    "lxc.seccomp": "lxc.seccomp.profile",
    "lxc.tty": "lxc.tty.max",
    "lxc.utsname": "lxc.uts.name",
}


# --- VM options (qemu-server $confdesc, PVE 8; only GPU-relevant formats are checked) ---

_PCIRE = r"(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?"


_HEXID = r"^0x[0-9a-fA-F]{4}$"


HOSTPCI_FMT: dict[str, Prop] = {
    "host": Prop(default_key=True, pattern=rf"{_PCIRE}(;{_PCIRE})*"),
    "mapping": Prop(format=verify_configid),
    "rombar": _bool(),
    "romfile": Prop(pattern=r"[^,;]+"),
    "pcie": _bool(),
    "x-vga": _bool(),
    "legacy-igd": _bool(),
    "mdev": Prop(pattern=r"[^/\.:]+"),
    "vendor-id": Prop(pattern=_HEXID),
    "device-id": Prop(pattern=_HEXID),
    "sub-vendor-id": Prop(pattern=_HEXID),
    "sub-device-id": Prop(pattern=_HEXID),
}


MACHINE_FMT: dict[str, Prop] = {
    "type": Prop(
        default_key=True,
        max_length=40,
        pattern=r"(pc|pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?|q35|pc-q35-\d+(\.\d+)+"
        r"(\+pve\d+)?(\.pxe)?|virt(?:-\d+(\.\d+)+)?(\+pve\d+)?)",
    ),
    "viommu": Prop(enum=("intel", "virtio")),
    "enable-s3": _bool(),
    "enable-s4": _bool(),
}


MEMORY_FMT: dict[str, Prop] = {"current": _int(default_key=True, minimum=16)}


QEMU_OPTIONS: dict[str, Prop] = {
    "acpi": _bool(),
    "affinity": Prop(),
    "agent": Prop(),
    "amd-sev": Prop(),
    "arch": Prop(enum=("x86_64", "aarch64")),
    "args": Prop(),
    "audio0": Prop(),
    "autostart": _bool(),
    "balloon": _int(minimum=0),
    "bios": Prop(enum=("seabios", "ovmf")),
    "boot": Prop(),
    "bootdisk": Prop(),
    "cdrom": Prop(),
    "cicustom": Prop(),
    "cipassword": Prop(),
    "citype": Prop(enum=("configdrive2", "nocloud", "opennebula")),
    "ciupgrade": _bool(),
    "ciuser": Prop(),
    "cores": _int(minimum=1),
    "cpu": Prop(),
    "cpulimit": Prop(type="number", minimum=0, maximum=128),
    "cpuunits": _int(minimum=1, maximum=262144),
    "description": Prop(max_length=8192),
    "efidisk0": Prop(),
    "freeze": _bool(),
    "hookscript": Prop(format=verify_volume_id),
    "hotplug": Prop(),
    "hugepages": Prop(enum=("any", "2", "1024")),
    "ivshmem": Prop(),
    "keephugepages": _bool(),
    "keyboard": Prop(),
    "kvm": _bool(),
    "localtime": _bool(),
    "lock": Prop(
        enum=tuple(
            "backup clone create migrate rollback snapshot snapshot-delete suspending "
            "suspended".split()
        )
    ),
    "machine": Prop(format=MACHINE_FMT),
    "memory": Prop(format=MEMORY_FMT),
    "migrate_downtime": Prop(type="number", minimum=0),
    "migrate_speed": _int(minimum=0),
    "name": Prop(format=verify_dns_name),
    "nameserver": Prop(),
    "numa": _bool(),
    "onboot": _bool(),
    "ostype": Prop(
        enum=tuple("other wxp w2k w2k3 w2k8 wvista win7 win8 win10 win11 l24 l26 solaris".split())
    ),
    "protection": _bool(),
    "reboot": _bool(),
    "rng0": Prop(),
    "scsihw": Prop(
        enum=tuple("lsi lsi53c810 virtio-scsi-pci virtio-scsi-single megasas pvscsi".split())
    ),
    "searchdomain": Prop(),
    "shares": _int(minimum=0, maximum=50000),
    "smbios1": Prop(),
    "smp": _int(minimum=1),
    "sockets": _int(minimum=1),
    "spice_enhancements": Prop(),
    "sshkeys": Prop(),
    "startdate": Prop(),
    "startup": Prop(format=STARTUP_FMT),
    "tablet": _bool(),
    "tags": Prop(format=verify_tag_list),
    "tdf": _bool(),
    "template": _bool(),
    "tpmstate0": Prop(),
    "vcpus": _int(minimum=1),
    "vga": Prop(),
    "vmgenid": Prop(),
    "vmstate": Prop(format=verify_volume_id),
    "vmstatestorage": Prop(),
    "watchdog": Prop(),
    "meta": Prop(),
    "runningmachine": Prop(),
    "runningcpu": Prop(),
    "parent": Prop(format=verify_configid, max_length=40),
    "snaptime": _int(minimum=0),
}


for _prefix, _count in (
    ("hostpci", 16), ("ide", 4), ("sata", 6), ("scsi", 31), ("virtio", 16), ("net", 32),
    ("ipconfig", 32), ("numa", 8), ("serial", 4), ("parallel", 3), ("usb", 30),
    ("unused", 256), ("virtiofs", 10),
):  # fmt: skip
    for _i in range(_count):
        QEMU_OPTIONS[f"{_prefix}{_i}"] = (
            Prop(format=HOSTPCI_FMT) if _prefix == "hostpci" else Prop()
        )


SNAPSHOT_ONLY = ("parent", "snaptime")  # in $confdesc, but not settable through the API
