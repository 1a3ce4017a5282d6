"""Module configuration and the device-node boot unit: the owned files the planner puts in the Plan.

Every file here is gpuhost's own (named gpuhost-*); when a setting is off its file is planned
absent, so turning a setting off converges back.
"""

from __future__ import annotations

from pathlib import Path

from gpuhost.paths import LIB_DIR

HEADER = "# Managed by gpuhost ({}); edit the inventory, not this file.\n"
NVIDIA_OPTIONS = "/etc/modprobe.d/gpuhost-nvidia.conf"
BLACKLIST = "/etc/modprobe.d/gpuhost-blacklist.conf"
NVIDIA_LOAD = "/etc/modules-load.d/gpuhost-nvidia.conf"
VFIO_LOAD = "/etc/modules-load.d/gpuhost-vfio.conf"
DEVICES_UNIT = "/etc/systemd/system/gpuhost-nvidia-devices.service"
DEVICES_WANTS = "/etc/systemd/system/multi-user.target.wants/gpuhost-nvidia-devices.service"
DEVICES_SCRIPT = f"{LIB_DIR}/nvidia-device-nodes"
DEVICE_FILES = (DEVICES_SCRIPT, DEVICES_UNIT, DEVICES_WANTS)  # the boot unit that makes the nodes
# The trial boot's userspace deadline: a timer that reboots an unconfirmed trial kernel's boot.
TRIAL_SCRIPT = f"{LIB_DIR}/trial-deadline"
TRIAL_UNIT = "/etc/systemd/system/gpuhost-trial-deadline.service"
TRIAL_TIMER = "/etc/systemd/system/gpuhost-trial-deadline.timer"
TRIAL_WANTS = "/etc/systemd/system/timers.target.wants/gpuhost-trial-deadline.timer"
# pve-guests.service waits on a trial boot until the commit (files/gpuhost-trial-hold).
TRIAL_HOLD_SCRIPT = f"{LIB_DIR}/trial-hold"
TRIAL_HOLD_DROPIN = "/etc/systemd/system/pve-guests.service.d/gpuhost-trial-hold.conf"
# Files that matter early in boot: the initramfs carries /etc/modprobe.d (initramfs-tools'
# kmod hook) but not modules-load.d, which only the real root's systemd-modules-load reads; so
# a blacklist takes effect in the initramfs only once it is rebuilt.
INITRAMFS_FILES = (BLACKLIST,)

_FILES = Path(__file__).parents[3] / "files"


def options_file(options: dict[str, dict[str, str]]) -> str | None:
    lines = "".join(
        f"options {module} {' '.join(f'{k}={v}' for k, v in values.items())}\n"
        for module, values in options.items()
    )
    return HEADER.format("module options") + lines if lines else None


def blacklist_file(modules: list[str]) -> str | None:
    lines = "".join(f"blacklist {m}\noptions {m} modeset=0\n" for m in modules)
    return HEADER.format("blacklist") + lines if lines else None


def load_file(purpose: str, modules: list[str] | None) -> str | None:
    return HEADER.format(purpose) + "".join(f"{m}\n" for m in modules) if modules else None


def static_file(name: str) -> str:
    """A file shipped in files/, verbatim."""
    return (_FILES / name).read_text()
