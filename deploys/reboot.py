"""Reboot only when something that needs a reboot changed, say why, and confirm the new boot."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy

from deploys import modules
from deploys.context import Context
from deploys.ops import reboot_and_confirm

# Reasons this deploy resolves by rebooting. Kernel, driver and GPU binding changes are
# reported in the plan but not acted on until their deploys exist.
HANDLED = ("cmdline", "modules")


def reasons(ctx: Context) -> list[str]:
    found = [str(r) for r in ctx.plan.reboot_reasons if r.concern in HANDLED]
    if modules.early_boot_changed(ctx):
        found.append("module blacklist / boot-time modules changed (initramfs)")
    return found


@deploy("Reboot when needed")
def reboot_if_needed(ctx: Context) -> None:
    found = reasons(ctx)
    later = [str(r) for r in ctx.plan.reboot_reasons if r.concern not in HANDLED]
    summary = "a reboot follows: " + "; ".join(found) if found else "no reboot needed"
    if later:
        summary += f" (left for later deploys: {'; '.join(later)})"
    logger.info(f"{host.print_prefix}{summary}")
    reboot_and_confirm(
        name="Reboot to apply boot-time changes",
        reasons=found,
        boot_id=ctx.boot_id,
        cmdline_present=ctx.plan.cmdline_add,
        cmdline_absent=ctx.plan.cmdline_remove,
        delay=int(host.data.get("gpuhost_reboot_delay", 10)),
        timeout=int(host.data.get("gpuhost_reboot_timeout", 600)),
    )
