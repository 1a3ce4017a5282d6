"""The lent 1x NVIDIA H200 machine gpuhost's audit is proven on (device kind `nvidia-h200`).

Not a Proxmox host: a Firecracker microVM with one H200 SXM (10de:2335) on the open driver
580.159.04, whose kernel (6.18.44-fc, GCC 15.3.0) is provided from outside. The audit runs there
on the machine itself (`--hosts=local://`); Proxmox-only checks skip. Facts as captured in
tests/fixtures/captures/h200x1.
"""

from gpuhost.spec.inventory import gpu_host

gpu_hosts = [
    gpu_host(
        "h200",
        ssh_hostname="localhost",
        spec={
            "kernel": {"version": "6.8.12-9-pve"},  # unused here: the kernel is not Proxmox's
            "toolchain": {"gcc": "15.3.0"},
            "driver": {"version": "580.159.04", "open": True},
            "boot": {"iommu": False},  # no IOMMU is exposed to the microVM
            "modules": {"uvm_disable_hmm": False},  # no containers here; HMM stays on
            "hardware": {"gpus": 1, "gpu_model": "NVIDIA H200"},
        },
    ),
]
