"""The local twins (simulated Proxmox GPU hosts) that `gpuhost twin` provisions.

Test infrastructure: each twin gets the spec of the real host its hardware profile imitates
(kpro6 twins are provisioned with inventory/kpro6.py's spec); a profile without a spec here is
never given another profile's. With GPUHOST_TWIN_TARGET set (`gpuhost twin` sets it to the twin
it started or found) the inventory holds that one twin only; without it, every developer twin
(index below the test range) whose profile has a spec. Each twin's running containers are guest
hosts too (`pyinfra inventory/twin.py deploys/gpu_guest.py --limit ct200`), reached on the
twin's guest addresses, their CUDA from the twin's local mirror (twin/demo_guests.py). Host keys
are still verified, against the known_hosts file the twins write; nothing here turns checking
off.
"""

import copy
import os
from pathlib import Path

from pyinfra.api.exceptions import InventoryError

from gpuhost.pve.guests import guests_of
from gpuhost.spec.inventory import GUEST_KEY, gpu_host, load_inventory
from twin import demo_guests, node

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


def _spec(t: node.Twin) -> dict:
    """The spec of ``t``'s profile, with what only this twin knows: its API token, where its
    containers listen, and its local mirror of NVIDIA's CUDA repository (twin/demo_guests.py)."""
    spec = copy.deepcopy(SPECS[t.profile])
    spec["proxmox"] = {"token_file": str(t.dir / "api-token")}  # a 0600 file, as a user keeps one
    for guest in spec.get("guests", []):
        if guest["kind"] != "lxc":
            continue
        if not (guest.get("access") or {}).get("ssh_hostname"):
            guest["access"] = {"ssh_hostname": t.guest_address(guest["ctid"])}
        if guest.get("cuda") and not guest.get("cuda_repo") and demo_guests.mirror_key(t).exists():
            key = demo_guests.mirror_key(t)
            guest["cuda_repo"] = {"url": demo_guests.mirror_url(t), "keyring": str(key)}
    return spec


def _running_containers(entry: tuple[str, dict], t: node.Twin) -> list[tuple[str, dict]]:
    """The twin's running containers as guest hosts (`--limit ct200`), once it has every guest
    its spec names (`gpuhost twin` creates them); its VMs run no system to connect to."""
    listed = demo_guests.listing(t)
    present = {(g["kind"], g["vmid"]) for g in listed}
    kinds = {"lxc": "lxc", "vm": "qemu"}
    named = {(kinds[g["kind"]], g.get("ctid", g.get("vmid"))) for g in SPECS[t.profile]["guests"]}
    if not named <= present:
        return []
    return [
        (name, data)
        for name, data in guests_of(entry, listed)
        if data[GUEST_KEY].kind == "lxc" and data[GUEST_KEY].status == "running"
    ]


_running = _targets()
twins = [
    gpu_host(
        t.name,
        _spec(t),
        source=__file__,
        ssh_hostname=t.address,
        ssh_user="root",
        ssh_key=str(node.client_key()),
        ssh_known_hosts_file=str(node.known_hosts()),
        ssh_strict_host_key_checking="yes",
        gpuhost_reboot_delay=1,  # a twin is back in well under a second
    )
    for t in _running
]
_guests = [
    (t, g) for entry, t in zip(twins, _running, strict=True) for g in _running_containers(entry, t)
]
# Each host once in an inventory: where several twins run a container of one name (a fleet of
# kpro6 twins each has ct200), each is named after its twin too (twin2-ct200).
_names = [name for _, (name, _) in _guests]
guests = [
    (f"{t.name}-{name}" if _names.count(name) > 1 else name, data) for t, (name, data) in _guests
]
