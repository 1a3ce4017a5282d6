"""kpro5: a simpler shape. All GPUs go to one container; packaged Proxmox kernel; GRUB."""

from gpuhost.spec.inventory import gpu_host

gpu_hosts = [
    gpu_host(
        "kpro5",
        ssh_hostname="kpro5.lan",
        spec={
            "kernel": {"version": "6.8.12-9-pve"},  # a packaged kernel from the host's apt sources
            "driver": {"version": "580.95.05"},
            "guests": [
                {"kind": "lxc", "ctid": 300, "name": "ct300", "gpus": "rest", "cuda": ["13.0"]},
            ],
        },
    ),
]
