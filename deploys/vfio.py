"""The VMs' PCI functions on vfio-pci: claimed at boot before any host driver, per BDF.

Writes the mechanism the Plan holds (gpuhost/plan/guests/vfio.py): /etc/modprobe.d/gpuhost-vfio.conf,
whose install lines claim the VMs' functions for vfio-pci before nvidia, nouveau, nvidiafb,
snd_hda_intel, xhci_pci or i2c_nvidia_gpu is inserted, the initramfs hook that puts vfio-pci in
the initramfs (which carries modprobe.d), and the boot unit that moves functions a built-in or
early driver took. The modprobe.d file and the hook record the initramfs rebuild as pending
first; the module options deploy that follows runs it (one rebuild for both); the unit records
systemd's reload. When no VM has GPUs the files are removed. A board bound to the
wrong driver now is moved live (:func:`deploys.rebind.rebind`) where the IOMMU is on; the
move is refused, naming the process and guest, while something holds the board.

Moving a board between nvidia and vfio-pci without a reboot: :func:`deploys.rebind.rebind`.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import deploy

from deploys.context import observed
from deploys.ops import apply_items
from deploys.rebind import rebind
from gpuhost.plan.guests.vfio import board_functions, misbound
from gpuhost.plan.make import Plan


@deploy("VFIO binding")
def configure(plan: Plan, live: bool = True) -> None:
    """The claim's files; with ``live`` (no reboot in this run: the boot's claim would do it)
    also the live moves of boards bound to the wrong driver now, whose guests
    deploys/split.py has stopped."""
    items = [item for item in plan.files.values() if item.concern == "vfio"]
    apply_items(items, "VFIO binding", plan.follow_ups)
    if not live:
        return
    # A board on the wrong side now moves live (refused, naming the holder, while in use).
    # Boards leave nvidia before any comes back, so a returning GPU takes the minor a leaving
    # one freed, as the Plan's container nodes expect (gpuhost.plan.guests.devices.planned_minors).
    facts = observed(host)
    moves = misbound(plan.gpus, facts)
    for gpu, driver in sorted(moves, key=lambda m: (m[1] != "vfio-pci", m[0])):
        rebind(
            name=f"Move GPU {gpu} and its functions to {driver}",
            functions=board_functions(plan.gpus, facts, gpu),
            driver=driver,
        )
