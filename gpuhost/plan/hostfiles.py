"""The files the host's boot and driver need, beside the loader files: modprobe.d and
modules-load.d, the boot units that make the device nodes, run a trial boot's deadline and start
the persistence daemon; and the steps those files need once they changed."""

from __future__ import annotations

import shlex

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.boot.cmdline import BootConfig
from gpuhost.plan.driver import modconf
from gpuhost.plan.driver.userspace import (
    PERSISTENCED_UNIT,
    PERSISTENCED_WANTS,
    DriverUserspace,
    persistenced_unit,
)
from gpuhost.plan.guests.mappings import UNIT as MAPPINGS_UNIT
from gpuhost.plan.guests.vfio import CLAIM_UNIT as VFIO_CLAIM_UNIT
from gpuhost.plan.guests.vfio import INITRAMFS_FILES as VFIO_INITRAMFS_FILES
from gpuhost.plan.model import FollowUp, ManagedFile
from gpuhost.plan.phases import ModulePlan
from gpuhost.spec.host import HostSpec


def host_files(
    boot: BootConfig, modules: ModulePlan, on_host: bool, userspace: DriverUserspace | None
) -> dict[str, ManagedFile]:
    """The loader files, modprobe.d and modules-load.d, the boot units that make the device
    nodes, run the trial's deadline and start the persistence daemon."""
    files = {path: ManagedFile(path, content, "cmdline") for path, content in boot.files.items()}
    for path, content in (
        (modconf.NVIDIA_OPTIONS, modconf.options_file(modules.options)),
        (modconf.BLACKLIST, modconf.blacklist_file(modules.blacklist)),
        (modconf.NVIDIA_LOAD, modconf.load_file("nvidia at boot", modules.load.get("nvidia"))),
        (modconf.VFIO_LOAD, modconf.load_file("vfio at boot", modules.load.get("vfio"))),
    ):
        files[path] = ManagedFile(path, content, "modules")
    # The boot unit that makes the device nodes the containers bind-mount (the driver makes none).
    files[modconf.DEVICES_SCRIPT] = ManagedFile(
        modconf.DEVICES_SCRIPT,
        modconf.static_file("nvidia-device-nodes") if on_host else None,
        "devices",
        mode="755",
    )
    files[modconf.DEVICES_UNIT] = ManagedFile(
        modconf.DEVICES_UNIT,
        modconf.static_file("gpuhost-nvidia-devices.service") if on_host else None,
        "devices",
    )
    files[modconf.DEVICES_WANTS] = ManagedFile(
        modconf.DEVICES_WANTS, None, "devices", link=modconf.DEVICES_UNIT if on_host else None
    )
    # The trial boot's deadline timer and the onboot guests' wait for the commit: installed on
    # every host, idle without a trial record.
    for path, shipped, mode in (
        (modconf.TRIAL_SCRIPT, "gpuhost-trial-deadline", "755"),
        (modconf.TRIAL_UNIT, "gpuhost-trial-deadline.service", "644"),
        (modconf.TRIAL_TIMER, "gpuhost-trial-deadline.timer", "644"),
        (modconf.TRIAL_HOLD_SCRIPT, "gpuhost-trial-hold", "755"),
        (modconf.TRIAL_HOLD_DROPIN, "gpuhost-trial-hold.conf", "644"),
    ):
        files[path] = ManagedFile(path, modconf.static_file(shipped), "trial", mode=mode)
    files[modconf.TRIAL_WANTS] = ManagedFile(
        modconf.TRIAL_WANTS, None, "trial", link=modconf.TRIAL_TIMER
    )
    # The persistence daemon's boot unit, with the userspace that brings its binary.
    unit = persistenced_unit(userspace)
    files[PERSISTENCED_UNIT] = ManagedFile(PERSISTENCED_UNIT, unit, "userspace")
    files[PERSISTENCED_WANTS] = ManagedFile(
        PERSISTENCED_WANTS, None, "userspace", link=PERSISTENCED_UNIT if unit else None
    )
    return files


def follow_ups(spec: HostSpec, facts: HostFacts, boot: BootConfig) -> list[FollowUp]:
    """The steps the managed files need once they changed: the loader refresh, the initramfs,
    systemd's reload."""
    tool = facts.boot_tool
    refresh = "proxmox-boot-tool refresh" if tool is not None and tool.configured else "update-grub"
    return [
        FollowUp("loader", refresh, tuple(boot.files)),
        FollowUp(
            "initramfs",
            # the kernel that boots next only: never the fallback's (every other kernel's)
            f"update-initramfs -u -k {shlex.quote(spec.kernel.version)}",
            (*modconf.INITRAMFS_FILES, *VFIO_INITRAMFS_FILES),
        ),
        FollowUp(
            "systemd",
            "systemctl daemon-reload",
            (
                modconf.DEVICES_UNIT,
                modconf.TRIAL_UNIT,
                modconf.TRIAL_TIMER,
                modconf.TRIAL_HOLD_DROPIN,
                PERSISTENCED_UNIT,
                VFIO_CLAIM_UNIT,
                MAPPINGS_UNIT,
            ),
        ),
    ]
