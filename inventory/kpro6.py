"""kpro6: the operator's host. 8x RTX PRO 6000 Blackwell (10de:2bb1), each GPU on its own PCIe
root port (so no P2P between any pair), AMD EPYC, 2 NUMA nodes, systemd-boot.
Six GPUs go to container 200 (inference), two to VM 129 (q35, vfio-pci)."""

from gpuhost.spec.inventory import gpu_host

gpu_hosts = [
    gpu_host(
        "kpro6",
        ssh_hostname="kpro6.lan",  # SSH host keys are verified: add kpro6 to known_hosts first
        ssh_user="root",
        spec={
            # The custom 6.14 kernel and the NVIDIA open modules are built by one GCC (12.2.0):
            # a kernel/module pair built by different compilers bricked this host once.
            "kernel": {
                "version": "6.14.8-2-bpo12-pve",
                "source": "build",
                "build": {
                    "repo": "/root/src/pve-kernel",
                    "ref": "bookworm-6.14",
                    "config": {"CONFIG_VFIO_PCI": "m"},
                },
                "keep": ["6.8.12-9-pve"],  # known-good fallback
            },
            "toolchain": {"gcc": "12.2.0"},
            "driver": {"version": "595.71.05", "open": True},  # Blackwell needs the open modules
            "boot": {
                "pci_realloc": True
            },  # large-BAR GPUs in the VM failed BAR allocation without it
            "guests": [
                {
                    "kind": "vm",
                    "vmid": 129,
                    "name": "vm129",
                    "machine": "q35",
                    "gpus": ["0000:c1:00.0", "0000:e1:00.0"],
                },
                {
                    "kind": "lxc",
                    "ctid": 200,
                    "name": "ct200",
                    "gpus": "rest",
                    "cuda": ["12.8", "13.0"],
                    # deploys/gpu_guest.py also needs "cuda_repo": {"url": NVIDIA's network
                    # repository for the container's distribution, "keyring": a copy of its
                    # signing key on this machine} (docs/guides/guest-software.md)
                    "env": {"NCCL_IB_DISABLE": "1"},
                },
            ],
        },
    ),
]
