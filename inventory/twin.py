"""The local twins (simulated Proxmox GPU hosts) that `gpuhost twin` provisions.

Test infrastructure: each twin gets the spec of the real host its hardware profile imitates
(kpro6 twins are provisioned with inventory/kpro6.py's spec); a profile without a spec here is
never given another profile's. With GPUHOST_TWIN_TARGET set (`gpuhost twin` sets it to the twin
it started or found) the inventory holds that one twin only; without it, every developer twin
(index below the test range) whose profile has a spec. Host keys are still verified, against the
known_hosts file the twins write; nothing here turns checking off.
"""

import os
from pathlib import Path

from pyinfra.api.exceptions import InventoryError

from gpuhost.spec.inventory import gpu_host, load_inventory
from twin import node

TARGET_ENV = "GPUHOST_TWIN_TARGET"
_HERE = Path(__file__).parent
SPECS = {  # hardware profile -> the spec a twin of that profile is provisioned with
    "kpro6": load_inventory(_HERE / "kpro6.py")["kpro6"][0].model_dump(mode="json"),
    # a GRUB/Intel board whose IOMMU groups need the ACS override; all GPUs to one container.
    # Its /boot is on LVM: GRUB has no true one-shot there, so its trial boots are accepted
    # explicitly (docs/concepts.md, Trial boots), as the owner of such a host must.
    "lumped": {
        "kernel": {"version": "6.8.12-9-pve", "trial": {"without_oneshot": True}},
        "driver": {"version": "580.95.05"},
        "boot": {"acs_override": "downstream,multifunction", "extra": ["pcie_aspm=off"]},
        "guests": [{"kind": "lxc", "ctid": 300, "name": "ct300", "gpus": "rest"}],
    },
}


def no_spec(twin: node.Twin) -> str:
    """Why ``twin`` cannot be provisioned from this file, and what to do instead."""
    profile = twin.profile or "bare"
    return (
        f"{twin.name} runs the {profile} profile, and inventory/twin.py has specs only for "
        f"{', '.join(SPECS)}: add a spec for {profile} to SPECS there, or stop it "
        f"(python -m twin stop {twin.name}) and start one of those (gpuhost twin --profile kpro6)"
    )


def _targets() -> list[node.Twin]:
    target = os.environ.get(TARGET_ENV)
    if not target:  # test sessions' twins (index >= FIRST_TEST_INDEX) are theirs alone
        running = [t for t in node.list_twins() if t.index < node.FIRST_TEST_INDEX]
        return [t for t in running if t.profile in SPECS]
    chosen = [t for t in node.list_twins() if t.name == target]
    if not chosen:
        raise InventoryError(f"{TARGET_ENV}={target}: no such twin (python -m twin list)")
    if chosen[0].profile not in SPECS:
        raise InventoryError(no_spec(chosen[0]))
    return chosen


twins = [
    gpu_host(
        t.name,
        {  # each twin's own API token (a 0600 file, as a user keeps one)
            **SPECS[t.profile],
            "proxmox": {"token_file": str(t.dir / "api-token")},
        },
        source=__file__,
        ssh_hostname=t.address,
        ssh_user="root",
        ssh_key=str(node.client_key()),
        ssh_known_hosts_file=str(node.known_hosts()),
        ssh_strict_host_key_checking="yes",
        gpuhost_reboot_delay=1,  # a twin is back in well under a second
    )
    for t in _targets()
]
