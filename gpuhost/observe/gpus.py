"""What gpuhost knows about NVIDIA GPU models, by PCI device id (vendor 10de).

NVIDIA does not hand out device ids in architecture ranges (the B300 is 10de:3182, far above the
RTX PRO 6000's 2bb1; Hopper's GH200 sits among GH100 ids), so every fact here comes from a table of
ids, never from a range. An id not in the table is unknown: gpuhost does not guess its
architecture.

Sources (checked 2026-12-01):
- names: the "Compatible GPUs" table of NVIDIA/open-gpu-kernel-modules README.md, release
  595.45.04 (commit df1c9a3d); the name column is the one nvidia-smi prints.
- chips and the HD-audio functions: pci.ids (github.com/pciutils/pciids, version 2026.08.22),
  vendor 10de.
- open-only: NVIDIA's kernel-module documentation (docs.nvidia.com driver installation guide,
  "Kernel Modules") and its 2024 "transitions fully towards open-source GPU kernel modules"
  announcement: Grace Hopper and Blackwell are supported only by the open kernel modules.
"""

from __future__ import annotations

from dataclasses import dataclass

ARCHITECTURES = ("ampere", "ada", "hopper", "blackwell")


@dataclass(frozen=True)
class GpuModel:
    name: str  # as nvidia-smi prints it (open-gpu-kernel-modules README)
    chip: str  # pci.ids chip name: GH100, AD102GL, GB202GL, ...
    architecture: str  # one of ARCHITECTURES
    open_only: bool  # the proprietary kernel modules do not support it


def _model(name: str, chip: str, architecture: str, open_only: bool = False) -> GpuModel:
    return GpuModel(name, chip, architecture, open_only or architecture == "blackwell")


# device id -> model. Several boards share one id (subsystem ids tell them apart); the name is
# the one the README lists for NVIDIA's own subsystem.
GPUS: dict[str, GpuModel] = {
    # Ampere (GA100 data-center parts, no display, no audio function)
    "20b0": _model("NVIDIA A100-SXM4-40GB", "GA100", "ampere"),
    "20b2": _model("NVIDIA A100-SXM4-80GB", "GA100", "ampere"),
    "20b3": _model("NVIDIA A100-SXM-64GB", "GA100", "ampere"),
    "20b5": _model("NVIDIA A100 80GB PCIe", "GA100", "ampere"),
    "20f1": _model("NVIDIA A100-PCIE-40GB", "GA100", "ampere"),
    # Hopper
    "2321": _model("NVIDIA H100 NVL", "GH100", "hopper"),
    "2329": _model("NVIDIA H20", "GH100", "hopper"),
    "232c": _model("NVIDIA H20-3e", "GH100", "hopper"),
    "2330": _model("NVIDIA H100 80GB HBM3", "GH100", "hopper"),  # H100 SXM5 80GB
    "2331": _model("NVIDIA H100 PCIe", "GH100", "hopper"),
    "2335": _model("NVIDIA H200", "GH100", "hopper"),  # H200 SXM 141GB
    "2339": _model("NVIDIA H100", "GH100", "hopper"),  # H100 SXM5 94GB
    "233b": _model("NVIDIA H200 NVL", "GH100", "hopper"),
    "2342": _model("NVIDIA GH200 120GB", "GH100", "hopper", open_only=True),  # Grace Hopper
    "2348": _model("NVIDIA GH200 144G HBM3e", "GH100", "hopper", open_only=True),
    # Ada Lovelace
    "2684": _model("NVIDIA GeForce RTX 4090", "AD102", "ada"),
    "26b1": _model("NVIDIA RTX 6000 Ada Generation", "AD102GL", "ada"),
    "26b5": _model("NVIDIA L40", "AD102GL", "ada"),
    "26b9": _model("NVIDIA L40S", "AD102GL", "ada"),
    "27b8": _model("NVIDIA L4", "AD104GL", "ada"),
    # Blackwell (data center: GB100 / GB110; RTX PRO: GB202GL)
    "2901": _model("NVIDIA B200", "GB100", "blackwell"),
    "2941": _model("NVIDIA GB200", "GB100", "blackwell"),
    "3182": _model("NVIDIA B300 SXM6 AC", "GB110", "blackwell"),
    "31c2": _model("NVIDIA GB300", "GB110", "blackwell"),
    "2b85": _model("NVIDIA GeForce RTX 5090", "GB202", "blackwell"),
    "2bb1": _model("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "GB202GL", "blackwell"),
    "2bb3": _model("NVIDIA RTX PRO 5000 Blackwell", "GB202GL", "blackwell"),
    "2bb4": _model(
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "GB202GL", "blackwell"
    ),
    "2bb5": _model("NVIDIA RTX PRO 6000 Blackwell Server Edition", "GB202GL", "blackwell"),
    "2bb9": _model("NVIDIA RTX 6000D", "GB202GL", "blackwell"),
}

# HD-audio controller functions of NVIDIA boards (function .1 beside the GPU at .0), by device
# id -> the chip whose board carries it (pci.ids). The data-center chips (GA100, GH100, GB100,
# GB110) have no audio function. Such a function shares the GPU's slot and usually its IOMMU
# group, so it goes wherever the GPU goes.
AUDIO: dict[str, str] = {
    "1aef": "GA102",
    "228b": "GA104",
    "228e": "GA106",
    "2291": "GA107",
    "22ba": "AD102",
    "22bb": "AD103",
    "22bc": "AD104",
    "22bd": "AD106",
    "22be": "AD107",
    "22e8": "GB202",
    "22e9": "GB203",
    "22eb": "GB206",
    "22ec": "GB207",
    "2f80": "GB205",
}


def _norm(device_id: str) -> str:
    # Accept "2bb1", "0x2bb1", "2BB1" and "10de:2bb1" alike: callers hold ids in all these forms.
    return device_id.lower().removeprefix("10de:").removeprefix("0x")


def gpu_model(device_id: str) -> GpuModel | None:
    return GPUS.get(_norm(device_id))


def architecture(device_id: str) -> str | None:
    """'hopper', 'blackwell', ...; None for an id gpuhost does not know."""
    model = gpu_model(device_id)
    return model.architecture if model else None


def model_name(device_id: str) -> str:
    model = gpu_model(device_id)
    return model.name if model else f"NVIDIA GPU [10de:{_norm(device_id)}]"


def needs_open_modules(device_id: str) -> bool:
    """Blackwell (and Grace Hopper) are supported only by the open kernel modules.

    An unknown id answers False: gpuhost cannot know, and the driver itself refuses a GPU it
    does not support when it loads.
    """
    model = gpu_model(device_id)
    return model.open_only if model else False


def is_nvidia_audio(device_id: str) -> bool:
    """Whether 10de:<device_id> is the HD-audio function of an NVIDIA board (e.g. 22e8)."""
    return _norm(device_id) in AUDIO
