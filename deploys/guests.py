"""Guests around a reboot: stop the running ones cleanly before, bring them back after.

Through Proxmox's own node-wide calls, the ones pve-guests.service uses at shutdown and boot:
`pvesh create /nodes/localhost/stopall --vms ...` shuts each listed guest down (timeout = its
`startup: down=`, else ``timeout``) and hard-stops it when the timeout passes (force-stop is on
by default), in reverse startup order, guests of one order in parallel; `startall --force 1
--vms ...` starts exactly the listed guests, onboot or not, in startup order with their `up`
pauses. Per-guest `pct shutdown`/`qm shutdown` then `stop` would re-implement that ordering,
the parallelism and the fallback. Both calls only warn about a guest that fails (the task ends
`WARNINGS: n`), so each operation then checks every guest's status itself.

Right before a start, this node's PCI mapping entries get the IOMMU groups of the running
kernel (deploys.vms.refresh_commands): a reboot can change the groups, and Proxmox refuses to
start a VM whose mapping names another group than the device has now.

Which guests were running is recorded in /var/lib/gpuhost/guests-before-reboot before any is
stopped and removed only when all are running again: a run killed in between brings them back
on its next run.
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import operation

from deploys.context import made_plan, observed
from deploys.ops import write_file
from deploys.vms import refresh_commands
from gpuhost.plan.guests.power import RECORD, Guest, GuestPower

TOOL = {"lxc": "pct", "qemu": "qm"}


def _vms(guests: list[Guest]) -> str:
    return ",".join(str(int(g.vmid)) for g in guests)


def _status_is(guest: Guest, status: str) -> str:
    return f"{TOOL[guest.kind]} status {int(guest.vmid)} | grep -qx 'status: {status}'"


@operation(is_idempotent=False)
def stop_guests(power: GuestPower, timeout: int = 180):
    """
    Shut down the running guests (reverse startup order), recording them first.

    + power: the Plan's (``guest_power`` or ``moving_guests``): the guests to stop, the record
      to keep
    + timeout: seconds each guest gets to shut down before it is stopped hard
    """
    if not power.stop:
        host.noop("no guest is running")
        return
    logger.info(
        f"{host.print_prefix}stopping {', '.join(g.word for g in power.stop)} (in this order)"
    )
    yield write_file(RECORD, power.record)
    yield f"pvesh create /nodes/localhost/stopall --vms {_vms(power.stop)} --timeout {int(timeout)}"
    yield " && ".join(
        f"{{ {_status_is(g, 'stopped')} || {{ echo '{g.word} still runs after stopall' >&2; "
        "exit 1; }; }"
        for g in power.stop
    )


def pve_guests_settled(limit: int) -> str:
    """Wait until pve-guests.service has started the onboot guests. After a boot systemd shows
    it "activating" until its ExecStartPre steps (gpuhost's trial hold among them) and its
    startall are over (pve-manager services/pve-guests.service: Type=oneshot,
    RemainAfterExit=yes). A run that goes on earlier races Proxmox: an onboot container the
    run stops to give it its device entries can be started again behind its back."""
    state = "systemctl show -p ActiveState --value pve-guests.service"
    return (
        f'i=0; while [ "$({state})" = activating ]; do i=$((i+1)); '
        f"if [ $i -ge {int(limit)} ]; then echo 'pve-guests.service is still starting the "
        f"onboot guests after {int(limit)} s' >&2; exit 1; fi; sleep 1; done"
    )


@operation(is_idempotent=False)
def start_guests(power: GuestPower, wait: int = 120, after_boot: bool = False, settle: int = 900):
    """
    Start the recorded guests in startup order, wait until each runs, remove the record.

    + power: the Plan's (``guest_power`` or ``moving_guests``): the guests to bring back
    + wait: seconds each guest may take to show as running
    + after_boot: this run booted the host: first let pve-guests.service finish its own start
      of the onboot guests (:func:`pve_guests_settled`)
    + settle: seconds that start may take
    """
    had_record = RECORD in (observed(host).managed.files if observed(host).managed else {})
    if after_boot:
        yield pve_guests_settled(settle)
    if not power.start:
        if had_record:
            yield f"rm -f {shlex.quote(RECORD)}"  # the recorded guests no longer exist
        elif not after_boot:
            host.noop("no guest to bring back")
        return
    logger.info(f"{host.print_prefix}starting {', '.join(g.word for g in power.start)}")
    plan = made_plan(host)
    if plan is not None:  # the VMs' PCI mappings as Proxmox checks them at this start
        yield from refresh_commands(plan)
    yield f"pvesh create /nodes/localhost/startall --force 1 --vms {_vms(power.start)}"
    # startall does not fail for a guest that did not start: wait for each one here.
    for g in power.start:
        yield (
            f"i=0; until {_status_is(g, 'running')}; do i=$((i+1)); "
            f"if [ $i -ge {int(wait)} ]; then echo '{g.word} did not start' >&2; exit 1; fi; "
            "sleep 1; done"
        )
    yield f"rm -f {shlex.quote(RECORD)}"
