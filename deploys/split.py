"""Moving GPUs between guests while the host runs: no GPU is ever in two running guests.
Which guests stop and start is the Plan's (``moving_guests``, gpuhost/plan/phases.py).

A guest whose GPU entries change (a container's device entries, a VM's owned hostpci entries,
gpuhost/plan/guests/containers.py and gpuhost/plan/guests/vms.py) is affected, on both sides of every move: the guest
that loses a GPU and the one that gains it. Without a host reboot in the run, every affected
guest that runs is shut down first (Proxmox's stopall, reverse startup order, recorded in
/var/lib/gpuhost/guests-before-reboot like around a reboot), then the entries are written, the
boards are rebound between nvidia and vfio-pci (deploys/vfio.py: now nothing holds them), the
containers start with their new entries (deploys/containers.py), and last the recorded guests
start again in startup order (startall). So a GPU leaves its old guest before any guest that
gains it starts, whatever the direction or a swap, and a run killed in between brings the
guests back on its next run from the record.

With a host reboot in the run, the reboot stops and starts the guests itself and the boot claims
the VMs' boards for vfio-pci; nothing is stopped here.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from deploys.context import observed
from deploys.guests import start_guests, stop_guests
from gpuhost.plan.guests.power import RECORD, GuestPower
from gpuhost.plan.make import Plan


def moving(plan: Plan) -> GuestPower | None:
    """The Plan's guests to stop and start around a live move; None where this run has none to
    stop or start and no record of an earlier run's to bring back (both operations would have
    nothing to do: a converged run then spends no operation on them)."""
    power = plan.moving_guests
    if power is None or power.stop or power.start:
        return power
    managed = observed(host).managed
    return power if managed is not None and RECORD in managed.files else None


@deploy("Release the GPUs that move")
def release(guests: GuestPower) -> None:
    stop_guests(name="Shut down the guests whose GPUs change", power=guests)


@deploy("Start the guests whose GPUs changed")
def restore(guests: GuestPower) -> None:
    start_guests(name="Start the guests whose GPUs changed", power=guests)
