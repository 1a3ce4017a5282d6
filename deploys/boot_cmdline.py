"""Kernel command line: IOMMU, ACS override, pci=realloc and the user's extra parameters.

systemd-boot hosts (proxmox-boot-tool with uefi ESPs) read /etc/kernel/cmdline; GRUB hosts
/etc/default/grub. Both are edited in place: only gpuhost's parameters change, everything else
the user put there stays. The boot loader is refreshed only when the file changed.
"""

from __future__ import annotations

import re

from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.operations import server

from deploys.context import Context
from deploys.ops import managed_file
from gpuhost.plan import plan_cmdline

KERNEL_CMDLINE = "/etc/kernel/cmdline"
DEFAULT_GRUB = "/etc/default/grub"
_GRUB_VAR = re.compile(r'^(?P<var>GRUB_CMDLINE_LINUX(?:_DEFAULT)?)="(?P<value>[^"]*)"\s*$')


def systemd_boot_cmdline(ctx: Context, current: str | None) -> str:
    if current is None or not current.strip():
        raise DeployError(
            f"{KERNEL_CMDLINE} is missing on a systemd-boot host; proxmox-boot-tool needs it "
            "with the root= parameter: create it from /proc/cmdline first"
        )
    first, *rest = current.splitlines()
    _, _, params = plan_cmdline(
        ctx.spec, ctx.facts.cpu_vendor, first.split(), ctx.plan.iommu_passthrough
    )
    return "\n".join([" ".join(params), *rest]) + "\n"


def grub_defaults(ctx: Context, current: str | None) -> str:
    """GRUB_CMDLINE_LINUX_DEFAULT gets the managed parameters; both variables lose stale ones."""
    if current is None:
        raise DeployError(f"{DEFAULT_GRUB} is missing on a GRUB host")
    lines = current.splitlines()
    found = {
        m["var"]: (i, m["value"].split())
        for i, line in enumerate(lines)
        if (m := _GRUB_VAR.match(line))
    }
    if "GRUB_CMDLINE_LINUX_DEFAULT" not in found:
        lines.append('GRUB_CMDLINE_LINUX_DEFAULT=""')
        found["GRUB_CMDLINE_LINUX_DEFAULT"] = (len(lines) - 1, [])
    linux = found.get("GRUB_CMDLINE_LINUX", (None, []))[1]
    default = found["GRUB_CMDLINE_LINUX_DEFAULT"][1]
    add, remove, _ = plan_cmdline(
        ctx.spec, ctx.facts.cpu_vendor, linux + default, ctx.plan.iommu_passthrough
    )
    for var, (i, params) in found.items():
        kept = [p for p in params if p not in remove]
        if var == "GRUB_CMDLINE_LINUX_DEFAULT":
            kept += add
        lines[i] = f'{var}="{" ".join(kept)}"'
    return "\n".join(lines) + "\n"


def refresh_command(ctx: Context) -> str:
    """What writes the new command line into the boot loader.

    systemd-boot ESPs and GRUB on proxmox-boot-tool-managed ESPs are synced by
    `proxmox-boot-tool refresh` (it runs update-grub too); a plain GRUB host by update-grub.
    """
    tool = ctx.facts.boot_tool
    return "proxmox-boot-tool refresh" if tool is not None and tool.configured else "update-grub"


@deploy("Kernel command line")
def configure(ctx: Context) -> None:
    if ctx.plan.loader == "systemd-boot":
        path = KERNEL_CMDLINE
        content = systemd_boot_cmdline(ctx, ctx.files.get(path))
    else:
        path = DEFAULT_GRUB
        content = grub_defaults(ctx, ctx.files.get(path))
    managed_file(
        name=f"Kernel parameters in {path}", path=path, content=content, current=ctx.files.get(path)
    )
    if content != ctx.files.get(path):
        refresh = refresh_command(ctx)
        server.shell(name=f"Write the boot loader configuration ({refresh})", commands=[refresh])
