"""The local twins (simulated Proxmox GPU hosts) that `python -m twin start` runs.

Test infrastructure: each twin gets the spec of the real host its hardware profile imitates
(kpro6 twins are provisioned with inventory/kpro6.py's spec). Host keys are still verified,
against the known_hosts file the twins write; nothing here turns checking off.
"""

from pathlib import Path

from gpuhost.inventory import gpu_host, load_inventory
from twin import node

_HERE = Path(__file__).parent
_SPECS = {
    "kpro6": load_inventory(_HERE / "kpro6.py")["kpro6"][0].model_dump(mode="json"),
    # a GRUB/Intel board whose IOMMU groups need the ACS override; all GPUs to one container
    "lumped": {
        "kernel": {"version": "6.8.12-9-pve"},
        "driver": {"version": "580.95.05"},
        "boot": {"acs_override": "downstream,multifunction", "extra": ["pcie_aspm=off"]},
        "guests": [{"kind": "lxc", "ctid": 300, "name": "ct300", "gpus": "rest"}],
    },
}

twins = [
    gpu_host(
        t.name,
        {  # each twin's own API token (a 0600 file, as a user keeps one)
            **_SPECS.get(t.profile or "kpro6", _SPECS["kpro6"]),
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
    for t in node.list_twins()
    if t.index < node.FIRST_TEST_INDEX  # test sessions' twins are theirs alone
]
