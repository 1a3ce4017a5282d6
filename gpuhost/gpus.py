"""What gpuhost knows about NVIDIA GPU models by PCI device id."""

from __future__ import annotations

# device id -> model name as nvidia-smi prints it (names of the boards gpuhost is used with)
MODELS = {
    "2330": "NVIDIA H100 80GB HBM3",
    "2335": "NVIDIA H200",
    "2684": "NVIDIA GeForce RTX 4090",
    "2bb1": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "2bb4": "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
    "2bb5": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
}

# Architectures by device-id range (NVIDIA allocates ids per chip family).
_ARCH_RANGES = (
    (0x2300, 0x23FF, "hopper"),
    (0x2600, 0x28FF, "ada"),
    (0x2900, 0x2FFF, "blackwell"),
)


def architecture(device_id: str) -> str | None:
    value = int(device_id, 16)
    for low, high, arch in _ARCH_RANGES:
        if low <= value <= high:
            return arch
    return None


def model_name(device_id: str) -> str:
    return MODELS.get(device_id, f"NVIDIA GPU [10de:{device_id}]")


def needs_open_modules(device_id: str) -> bool:
    """Blackwell and newer are supported only by the open kernel modules."""
    return architecture(device_id) == "blackwell"
