"""This node's entries of gpuhost's PCI mappings brought to the IOMMU groups of the running
kernel, after a reboot and before any guest starts.

Proxmox checks a mapping's group against the device at every VM start (pve-guest-common
src/PVE/Mapping/PCI.pm, assert_valid), and the groups can change at a reboot (the IOMMU turned
on, an ACS override, a new kernel): an entry written before such a reboot stops the VM from
starting after it. The VMs with `onboot` are started at boot by pve-guests.service (pve-manager
services/pve-guests.service: `pvesh --nooutput create /nodes/localhost/startall`), before any
deploy is back, so the refresh is a boot unit ordered before it (``UNIT``, which runs
``SCRIPT``); the deploy runs the same commands again before it starts guests itself
(deploys/guests.py). Only the group is taken from the host: the id and subsystem id stay the
Plan's, so a swapped board still fails the start, as Proxmox intends. Pure: text only.
"""

from __future__ import annotations

from pathlib import Path

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.paths import LIB_DIR
from gpuhost.plan.guests.split import slot
from gpuhost.plan.guests.vms import PciMapping, board_mapping

SCRIPT = f"{LIB_DIR}/pci-mappings"
UNIT = "/etc/systemd/system/gpuhost-pci-mappings.service"
WANTS = "/etc/systemd/system/multi-user.target.wants/gpuhost-pci-mappings.service"
PCI_CFG = "/etc/pve/mapping/pci.cfg"
_FILES = Path(__file__).resolve().parents[3] / "files"
# The other nodes' `map` lines of mapping `id` in pci.cfg (an id line, then tab-indented
# properties), each as `--map <value>` (values hold no blanks: Proxmox's property strings).
_OTHERS = (
    "/^[^ \\t]/ { cur = $1; next } "
    'cur == id && $1 == "map" { n = split($2, p, ","); '
    'for (i = 1; i <= n; i++) if (p[i] == me) next; print "--map", $2 }'
)


def refresh_command(mapping: PciMapping) -> str:
    """The shell that brings this node's map entry of ``mapping`` to the board's group as the
    running kernel has it, where it differs, keeping the other nodes' entries as pci.cfg has
    them then; nothing while the mapping does not exist (its VM not made yet). The node is
    Proxmox's (/etc/pve/local links to nodes/<node>)."""
    tail = f"path={mapping.path}"
    if mapping.subsystem_id is not None:
        tail += f",subsystem-id={mapping.subsystem_id}"
    return (
        'n=$(readlink /etc/pve/local); n=${n#nodes/}; test -n "$n" || exit 1; '
        f'grep -q "^{mapping.id}[[:space:]]*$" {PCI_CFG} || exit 0; '
        f"g=$(readlink /sys/bus/pci/devices/{mapping.path}.0/iommu_group 2>/dev/null); "
        f"g=${{g##*/}}; e=id={mapping.vendor_device}${{g:+,iommugroup=$g}},node=$n,{tail}; "
        f'grep -qxF "$(printf "\\tmap %s" "$e")" {PCI_CFG} || '
        f"pvesh set /cluster/mapping/pci/{mapping.id} "
        f'$(awk -v id={mapping.id} -v me="node=$n" \'{_OTHERS}\' {PCI_CFG}) --map "$e"'
    )


def boot_script(mappings: dict[str, PciMapping]) -> str:
    lines = [
        "#!/bin/sh",
        "# Managed by gpuhost (gpuhost/plan/guests/mappings.py); edit the inventory, not this file.",
        "# This node's entries of gpuhost's PCI mappings get the IOMMU groups of the booted",
        "# kernel, before pve-guests.service starts the onboot guests.",
        "rc=0",
        *(f"( {refresh_command(m)} ) || rc=1" for _, m in sorted(mappings.items())),
        'exit "$rc"',
    ]
    return "\n".join(lines) + "\n"


def boot_mappings(vm_functions: dict[int, tuple[str, ...]], facts: HostFacts) -> dict:
    """The mappings of every board the spec gives a VM, whether or not the VM exists yet (the
    unit then stays as it is when the VM is made)."""
    boards = sorted({slot(bdf) for bdfs in vm_functions.values() for bdf in bdfs})
    found = (board_mapping(board, facts) for board in boards)
    return {m.id: m for m in found if m is not None}


def refresh_files(
    mappings: dict[str, PciMapping],
) -> list[tuple[str, str | None, str, str | None]]:
    """(path, content or None for absent, mode, symlink target) of the boot refresh of
    ``mappings`` (boot_mappings): all absent when no VM has GPUs."""
    on = bool(mappings)
    unit = (_FILES / "gpuhost-pci-mappings.service").read_text() if on else None
    return [
        (SCRIPT, boot_script(mappings) if on else None, "755", None),
        (UNIT, unit, "644", None),
        (WANTS, None, "644", UNIT if on else None),
    ]
