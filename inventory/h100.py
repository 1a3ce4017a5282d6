"""The lent 1x NVIDIA H100 machine gpuhost's audit is proven on (device kind `nvidia-h100-x1`).

Not a Proxmox host: a Firecracker microVM with one H100 80GB HBM3 SXM (10de:2330) on the open
driver 580.159.04, whose kernel (6.18.44-fc, GCC 15.3.0) is provided from outside, as on the
H200 machine (inventory/h200.py). The audit runs there on the machine itself
(`--hosts=local://`); Proxmox-only checks skip. Facts as captured in
tests/fixtures/captures/h100x1.
"""

from gpuhost.spec.inventory import gpu_host

gpu_hosts = [
    gpu_host(
        "h100",
        ssh_hostname="localhost",
        spec={
            "kernel": {"version": "6.8.12-9-pve"},  # unused here: the kernel is not Proxmox's
            "toolchain": {"gcc": "15.3.0"},
            "driver": {"version": "580.159.04", "open": True},
            "boot": {"iommu": False},  # no IOMMU is exposed to the microVM
            "modules": {"uvm_disable_hmm": False},  # no containers here; HMM stays on
            "hardware": {"gpus": 1, "gpu_model": "NVIDIA H100 80GB HBM3"},
        },
    ),
]
