"""Module options and boot-time modules: nvidia_uvm options, nouveau blacklist, vfio at boot.

Each is an owned drop-in (gpuhost-*.conf) that is written when wanted and removed when not,
so turning a setting off converges back. The initramfs is rebuilt only when a change matters
early in boot (the blacklist and the vfio modules); nvidia_uvm is loaded later, from the rootfs.
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import server

from deploys.context import Context
from deploys.ops import managed_file

HEADER = "# Managed by gpuhost ({}); edit the inventory, not this file.\n"
NVIDIA_OPTIONS = "/etc/modprobe.d/gpuhost-nvidia.conf"
BLACKLIST = "/etc/modprobe.d/gpuhost-blacklist.conf"
VFIO_LOAD = "/etc/modules-load.d/gpuhost-vfio.conf"
NVIDIA_LOAD = "/etc/modules-load.d/gpuhost-nvidia.conf"


def wanted_files(ctx: Context) -> dict[str, str | None]:
    plan = ctx.plan
    options = "".join(
        f"options {module} {' '.join(f'{k}={v}' for k, v in values.items())}\n"
        for module, values in plan.module_options.items()
    )
    blacklist = "".join(f"blacklist {m}\noptions {m} modeset=0\n" for m in plan.blacklist)
    load = {name: "".join(f"{m}\n" for m in mods) for name, mods in plan.modules_load.items()}
    return {
        NVIDIA_OPTIONS: HEADER.format("module options") + options if options else None,
        BLACKLIST: HEADER.format("blacklist") + blacklist if blacklist else None,
        NVIDIA_LOAD: HEADER.format("nvidia at boot") + load["nvidia"] if "nvidia" in load else None,
        VFIO_LOAD: HEADER.format("vfio at boot") + load["vfio"] if "vfio" in load else None,
    }


def early_boot_changed(ctx: Context) -> bool:
    files = wanted_files(ctx)
    return any(files[p] != ctx.files.get(p) for p in (BLACKLIST, VFIO_LOAD))


@deploy("Module options")
def configure(ctx: Context) -> None:
    for path, content in wanted_files(ctx).items():
        managed_file(
            name=f"Module configuration {path}",
            path=path,
            content=content,
            current=ctx.files.get(path),
        )
    if early_boot_changed(ctx):
        server.shell(
            name="Rebuild the initramfs (blacklist / vfio changed)",
            commands=["update-initramfs -u -k all"],
        )
