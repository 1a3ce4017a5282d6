"""Reboot only for what the host shows needs one, say why, confirm the new boot, never loop.

The reasons come from the Plan, which reads them off the running host (the command line it
booted with, live module parameters), so a run killed anywhere still reboots on the next one
if the host needs it, and a converged host is never rebooted.

No reboot loops: before rebooting, gpuhost records the boot id and the reasons in
/var/lib/gpuhost/last-reboot. If a later run finds the host booted since then and would reboot
for one of the same reasons, that reboot did not fix it, and another would not either: the run
stops with the reason instead. A confirmed reboot removes the record.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, StringCommand, deploy, operation
from pyinfra.api.exceptions import DeployError

from deploys.context import observed
from deploys.guests import start_guests, stop_guests
from deploys.ops import step_settled, write_file
from gpuhost.observe.files import BootId
from gpuhost.observe.kernel import KernelBuildInfo, KernelCmdline
from gpuhost.observe.pci import PciDevice, PciDevices
from gpuhost.paths import STATE_DIR
from gpuhost.plan.guests.power import RECORD as GUESTS_RECORD
from gpuhost.plan.guests.power import GuestPower
from gpuhost.plan.make import Plan

RECORD = f"{STATE_DIR}/last-reboot"


def parse_record(text: str | None) -> tuple[str | None, list[str]]:
    """(boot id before the recorded reboot, its reasons) from the record file."""
    boot_id, reasons = None, []
    for line in (text or "").splitlines():
        key, _, value = line.partition("=")
        if key == "boot_id":
            boot_id = value
        elif key == "reason":
            reasons.append(value)
    return boot_id, reasons


def render_record(boot_id: str, reasons: list[str]) -> str:
    return f"boot_id={boot_id}\n" + "".join(f"reason={r}\n" for r in reasons)


def repeated(plan: Plan, record: str | None, boot_id: str | None) -> list[str]:
    """Reasons the last recorded reboot was made for that this boot still shows."""
    before, reasons = parse_record(record)
    if before is None or before == boot_id:
        return []  # no reboot recorded, or it was asked for and has not happened yet
    return [str(r) for r in plan.reboot_now if str(r) in reasons]


def misbound_after_boot(plan: Plan, pci: dict[str, PciDevice]) -> list[str]:
    """The planned bindings a new boot did not make, one phrase each: every function planned
    for a VM must be on vfio-pci, and no GPU planned for the host may be."""
    wrong = []
    for bdf in plan.vfio.bdfs if plan.vfio is not None else ():
        driver = pci[bdf].driver if bdf in pci else None
        if bdf in pci and driver != "vfio-pci":
            wrong.append(f"{bdf} is on {driver or 'no driver'}, not vfio-pci")
    for a in plan.gpus:
        if a.driver_planned == "nvidia" and a.bdf in pci and pci[a.bdf].driver == "vfio-pci":
            wrong.append(f"host GPU {a.bdf} is on vfio-pci, not nvidia")
    return wrong


def read_fact(host, fact) -> object | None:
    """A fact read that may meet the old boot going down: None instead of failing the host
    (host.get_fact would mark the host failed on the dropped session)."""
    try:
        ok, output = host.run_shell_command(StringCommand(fact.command()), print_output=False)
    except Exception:  # paramiko's EOFError/SSHException/socket errors as sshd goes away
        return None
    return fact.process(output.stdout_lines) if ok and output.stdout_lines else None


@dataclass(frozen=True)
class NewBoot:
    boot_id: str
    kernel: str  # the release it runs
    cmdline: list[str] | None  # /proc/cmdline, when asked for


def wait_for_boot(
    host, before: str | None, delay: int, timeout: int, cmdline: bool = False
) -> NewBoot:
    """The boot after ``before`` (a boot id), once the host is back: reconnect every second
    until ``timeout`` seconds have passed. A new boot id marks the new boot, so the old boot
    going down is never taken for it (as /proc/uptime can be, read within a second).

    + cmdline: read /proc/cmdline too, and wait until it reads
    """
    time.sleep(delay)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        host.disconnect()
        host.connect(show_errors=False)
        if host.connected:
            boot_id = read_fact(host, BootId())
            line = read_fact(host, KernelCmdline()) if cmdline else None
            kernel = read_fact(host, KernelBuildInfo())
            if boot_id not in (None, before) and (line is not None or not cmdline) and kernel:
                return NewBoot(str(boot_id), kernel.release, line)
        time.sleep(1)
    raise OperationError(f"the host did not come back with a new boot within {timeout} s")


@operation(is_idempotent=False)
def reboot_and_confirm(
    plan: Plan, delay: int = 10, timeout: int = 600, guests: GuestPower | None = None
):
    """
    Reboot for the Plan's reasons, wait for the host, and confirm the new boot.

    + plan: the host's Plan: reasons, the command line and kernel the new boot must show
    + delay, timeout: seconds before the first reconnect attempt, and overall
    + guests: the running guests to shut down after the reboot record is written and before
      the reboot (:func:`deploys.guests.stop_guests`); None leaves them to the host's shutdown

    Unlike ``server.reboot``, which watches /proc/uptime drop (and can mistake the old boot
    for the new one when it reconnects within a second), this waits for a new boot id.
    """
    now = observed(host)
    assert now.managed is not None
    record = now.managed.files.get(RECORD)
    reasons = [str(r) for r in plan.reboot_now]
    if not reasons:
        if record is not None:
            yield StringCommand("rm -f", shlex.quote(RECORD))  # an earlier reboot did its job
        else:
            host.noop("no reboot needed")
        return
    again = repeated(plan, record, now.boot_id)
    if again:
        raise DeployError(
            f"{host.name}: not rebooting again: the last reboot was made for "
            f"{'; '.join(again)}, and the host came back without it. /proc/cmdline is now: "
            f"{' '.join(now.cmdline)}. Check that the boot loader reads gpuhost's configuration "
            f"({', '.join(p for p, f in plan.files.items() if f.concern == 'cmdline')}): "
            "`proxmox-boot-tool status` / `update-grub` output, the loader's entries. When it is "
            f"fixed, remove {RECORD} and run the deploy again."
        )
    logger.info(f"{host.print_prefix}rebooting now (reasons in the plan above)")
    # Record, stop the guests, then reboot detached, so the SSH channel closes before the host
    # goes down (see pyinfra #1708).
    yield write_file(RECORD, render_record(now.boot_id or "", reasons))
    if guests is not None:
        yield from stop_guests._inner(power=guests)
    yield "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &"

    def wait_for_new_boot(state, host) -> bool:
        boot = wait_for_boot(host, now.boot_id, delay, timeout, cmdline=True)
        cmdline = boot.cmdline or []
        missing = [p for p in plan.cmdline_present if p not in cmdline]
        stale = [p for p in plan.cmdline_absent if p in cmdline]
        if missing or stale:
            raise OperationError(
                f"after the reboot /proc/cmdline lacks {missing or 'nothing'} and still has "
                f"{stale or 'nothing'}: the boot loader did not take the new command line"
            )
        if boot.kernel != plan.running_kernel:
            raise OperationError(f"the host booted kernel {boot.kernel}, not {plan.running_kernel}")
        wrong = misbound_after_boot(plan, read_fact(host, PciDevices()) or {})
        if wrong:
            raise OperationError(
                f"after the reboot {'; '.join(wrong)}: the boot did not make the planned "
                "bindings (see `systemctl status gpuhost-vfio-claim` and dmesg)"
            )
        host.run_shell_command(StringCommand("rm -f", shlex.quote(RECORD)), print_output=False)
        logger.info(
            f"{host.print_prefix}new boot {boot.boot_id}: bindings and kernel command line confirmed"
        )
        return True

    yield FunctionCommand(wait_for_new_boot, (), {})


@operation()
def pin_kernel(plan: Plan):
    """
    Pin the running kernel before a reboot when something else would boot.

    + plan: the host's Plan (``pin_running_kernel``, ``running_kernel``, ``next_boot_kernel``)
    """
    if not plan.pin_running_kernel or not plan.reboot_now:
        host.noop(f"the next boot starts {plan.next_boot_kernel or 'the running kernel'}")
        return
    release = shlex.quote(plan.running_kernel)
    yield f"proxmox-boot-tool kernel pin {release} && proxmox-boot-tool refresh"


def settled(plan: Plan) -> bool:
    """Nothing of this step to do: each of its operations' own no-op condition holds (no reboot
    now, so no pin and no reboot; no reboot record left to clear; no guest recorded or planned
    to bring back, and no boot to let settle)."""
    managed = observed(host).managed
    files = managed.files if managed is not None else {}
    power = plan.guest_power
    return (
        not plan.reboot_now
        and not plan.rebooting
        and RECORD not in files
        and GUESTS_RECORD not in files
        and (power is None or not power.start)
    )


@deploy("Reboot when needed")
def reboot_if_needed(plan: Plan) -> None:
    if settled(plan):
        step_settled(name="Reboot when needed", message="no reboot needed, no guest to bring back")
        return
    pin_kernel(name="Keep the running kernel for the reboot", plan=plan)
    guests = plan.guest_power
    assert guests is not None  # a deploy's facts carry the guests' statuses
    reboot_and_confirm(
        name="Reboot to apply boot-time changes",
        plan=plan,
        delay=int(host.data.get("gpuhost_reboot_delay", 10)),
        timeout=int(host.data.get("gpuhost_reboot_timeout", 600)),
        guests=guests,
    )
    start_guests(
        name="Bring back the guests that ran before the reboot",
        power=guests,
        after_boot=plan.rebooting,
    )
