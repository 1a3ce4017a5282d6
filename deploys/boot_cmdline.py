"""Kernel command line: the Plan's boot loader files, then the loader refresh they need.

systemd-boot hosts (proxmox-boot-tool, uefi ESPs) read /etc/kernel/cmdline; GRUB hosts get
gpuhost's drop-in /etc/default/grub.d/gpuhost.cfg (see gpuhost/plan/boot/cmdline.py). The refresh runs
when the files change, or when an earlier run changed them and did not get to refresh.

While a trial boot is due on systemd-boot the files are left as they are: the trial entry
boots the new command line and the fallback's entries keep theirs; the trial's commit writes
them (deploys/trial_boot.py). Outside a trial, the live panic settings are put back to the
Plan's when a trial's commit did not get to it.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy, operation

from deploys.context import observed
from deploys.ops import apply_files
from gpuhost.plan.make import Plan
from gpuhost.plan.trial.params import settle_commands
from gpuhost.plan.trial.state import Step


@operation()
def panic_settings(plan: Plan):
    """
    The live /proc/sys/kernel panic settings as the Plan has them (a trial boot runs with them on).

    + plan: the host's Plan (``panic_sysctls``)
    """
    live = observed(host).panic
    if plan.trial_step is not Step.CONVERGED or live is None:
        host.noop("the trial boot's commit sets them")
        return
    wrong = {k: v for k, v in plan.panic_sysctls.items() if k in live and live[k] != v}
    if not wrong:
        host.noop("panic settings as planned")
        return
    yield from settle_commands(wrong)


@deploy("Kernel command line")
def configure(plan: Plan) -> None:
    if not plan.boot_config_at_commit:
        apply_files(plan, "cmdline", "loader", "Kernel parameters")
    panic_settings(name="Kernel panic settings", plan=plan)
