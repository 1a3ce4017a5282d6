"""GPU facts by PCI device id, from a table (sources in gpuhost/observe/gpus.py)."""

import pytest

from gpuhost.observe.gpus import (
    AUDIO,
    GPUS,
    architecture,
    is_nvidia_audio,
    model_name,
    needs_open_modules,
)
from gpuhost.observe.nvidia import parse_gpu_query
from tests.unit.conftest import captured


@pytest.mark.parametrize(
    ("device", "arch", "name"),
    [
        ("2bb1", "blackwell", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"),
        ("2bb4", "blackwell", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"),
        ("2bb5", "blackwell", "NVIDIA RTX PRO 6000 Blackwell Server Edition"),
        ("3182", "blackwell", "NVIDIA B300 SXM6 AC"),  # far outside any "Blackwell range"
        ("2901", "blackwell", "NVIDIA B200"),
        ("2941", "blackwell", "NVIDIA GB200"),
        ("2335", "hopper", "NVIDIA H200"),
        ("233b", "hopper", "NVIDIA H200 NVL"),
        ("2330", "hopper", "NVIDIA H100 80GB HBM3"),
        ("2331", "hopper", "NVIDIA H100 PCIe"),
        ("2321", "hopper", "NVIDIA H100 NVL"),
        ("2329", "hopper", "NVIDIA H20"),
        ("26b9", "ada", "NVIDIA L40S"),
        ("26b5", "ada", "NVIDIA L40"),
        ("27b8", "ada", "NVIDIA L4"),
        ("26b1", "ada", "NVIDIA RTX 6000 Ada Generation"),
        ("2684", "ada", "NVIDIA GeForce RTX 4090"),
        ("20b2", "ampere", "NVIDIA A100-SXM4-80GB"),
        ("20b5", "ampere", "NVIDIA A100 80GB PCIe"),
    ],
)
def test_table(device: str, arch: str, name: str) -> None:
    assert architecture(device) == arch
    assert model_name(device) == name
    assert needs_open_modules(device) == (arch == "blackwell")


def test_id_forms() -> None:
    assert architecture("10de:2BB1") == architecture("0x2bb1") == "blackwell"


def test_unknown_ids_are_not_guessed() -> None:
    # 2bff lies between Blackwell ids; 2300 between Hopper ones: neither is in the table
    for device in ("2bff", "2300", "ffff"):
        assert architecture(device) is None
        assert needs_open_modules(device) is False
    assert model_name("2bff") == "NVIDIA GPU [10de:2bff]"


def test_grace_hopper_is_open_only() -> None:
    assert architecture("2342") == "hopper" and needs_open_modules("2342")


def test_audio_functions_are_not_gpus() -> None:
    assert is_nvidia_audio("22e8") and AUDIO["22e8"] == "GB202"  # RTX PRO 6000 board's audio
    assert is_nvidia_audio("10de:22BA")  # AD102 (RTX 4090, RTX 6000 Ada)
    assert not is_nvidia_audio("2bb1") and architecture("22e8") is None
    assert not set(AUDIO) & set(GPUS)


def test_names_match_real_nvidia_smi(machine: str) -> None:
    for gpu in parse_gpu_query(captured(machine, "NvidiaGpus")).gpus:
        device = gpu.vendor_device.split(":")[1]
        assert model_name(device) == gpu.name  # "NVIDIA H200" for 10de:2335
