import pytest

from gpuhost.observe.nvidia import NvidiaP2P, parse_gpu_query, parse_p2p, parse_topology
from gpuhost.observe.nvidia_driver import parse_driver_version, parse_gpu_information
from gpuhost.observe.parse import UnparsedOutput
from tests.unit.conftest import FIXTURES, captured


def test_gpu_query_two_h200() -> None:
    query = parse_gpu_query(captured("h200x2", "NvidiaGpus"))
    assert query.error is None
    assert [(g.index, g.bdf) for g in query.gpus] == [(0, "0000:00:06.0"), (1, "0000:00:07.0")]
    gpu = query.gpus[1]
    assert (gpu.name, gpu.memory_mib, gpu.compute_cap) == ("NVIDIA H200", 143771, "9.0")
    assert (gpu.driver_version, gpu.vendor_device, gpu.persistence_mode) == (
        "580.159.04",
        "10de:2335",
        True,
    )
    assert gpu.uuid.startswith("GPU-") and gpu.vbios == "96.00.A5.00.1A"


def test_gpu_query_counts_the_machines_gpus(machine: str) -> None:
    query = parse_gpu_query(captured(machine, "NvidiaGpus"))
    assert len(query.gpus) == {"h200x1": 1, "h200x2": 2, "h100x1": 1}[machine]
    h100 = machine == "h100x1"
    assert {g.name for g in query.gpus} == {"NVIDIA H100 80GB HBM3" if h100 else "NVIDIA H200"}


def test_gpu_query_failure_is_a_state_not_a_crash() -> None:
    # The raw capture of `nvidia-smi -i 99` (a real failure) with its real exit status 6
    raw = FIXTURES / "captures" / "h200x2"
    lines = (raw / "smi_bad_index.out").read_text().splitlines()
    status = (raw / "smi_bad_index.rc").read_text().strip()
    query = parse_gpu_query([*lines, f"#gpuhost-exit={status}"])
    assert query.gpus == [] and query.error == "No devices were found"


def test_gpu_query_unknown_header_fails_loudly() -> None:
    with pytest.raises(UnparsedOutput, match="unexpected header"):
        parse_gpu_query(["index, name", "0, x", "#gpuhost-exit=0"])


def test_topology_nvlink_pair() -> None:
    topo = parse_topology(captured("h200x2", "NvidiaTopology"))
    assert topo is not None
    assert topo.gpus == ["GPU0", "GPU1"]
    assert topo.links[("GPU0", "GPU1")] == "NV18" and topo.links[("GPU1", "GPU1")] == "X"
    assert topo.cpu_affinity == {"GPU0": "0-31", "GPU1": "0-31"}
    assert topo.numa_affinity == {"GPU0": 0, "GPU1": 0}


def test_topology_single_gpu() -> None:
    topo = parse_topology(captured("h200x1", "NvidiaTopology"))
    assert topo is not None and topo.links == {("GPU0", "GPU0"): "X"}
    assert topo.cpu_affinity == {"GPU0": "0-15"}


def test_topology_pcie_with_nics_and_older_columns() -> None:
    # Layout of docs/reference/formats.md §8 (8x RTX 4090, NICs, NUMA 1 with GPU NUMA ID N/A), 3 GPUs kept
    lines = [
        "\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID",
        "GPU0\t X \tNODE\tSYS\tSYS\t0-55,112-167\t0\t\tN/A",
        "GPU1\tNODE\t X \tSYS\tSYS\t0-55,112-167\t0\t\tN/A",
        "GPU2\tSYS\tSYS\t X \tPHB\t56-111,168-223\t1\t\tN/A",
        "NIC0\tSYS\tSYS\tPHB\t X ",
        "",
        "Legend:",
        "#gpuhost-exit=0",
    ]
    topo = parse_topology(lines)
    assert topo is not None
    assert topo.links[("GPU0", "GPU2")] == "SYS" and topo.numa_affinity["GPU2"] == 1
    old = [
        "\tGPU0\tGPU1\tCPU Affinity",
        "GPU0\t X \tPIX\t0-11",
        "GPU1\tPIX\t X \t0-11",
        "#gpuhost-exit=0",
    ]
    old_topo = parse_topology(old)
    assert (
        old_topo is not None
        and old_topo.links[("GPU1", "GPU0")] == "PIX"
        and old_topo.numa_affinity == {}
    )


def test_topology_unknown_link_fails_loudly() -> None:
    with pytest.raises(UnparsedOutput, match="unknown link"):
        parse_topology(["\tGPU0\tGPU1", "GPU0\t X \tWAT", "#gpuhost-exit=0"])


def test_topology_without_driver_is_none() -> None:
    assert parse_topology(["NVIDIA-SMI has failed because ...", "#gpuhost-exit=9"]) is None


@pytest.mark.parametrize("mode", ["r", "w"])
def test_p2p_matrix(mode: str) -> None:
    matrix = parse_p2p(captured("h200x2", f"NvidiaP2P-{mode}"))
    assert matrix == {
        ("GPU0", "GPU0"): "X",
        ("GPU0", "GPU1"): "OK",
        ("GPU1", "GPU0"): "OK",
        ("GPU1", "GPU1"): "X",
    }
    assert parse_p2p(captured("h200x1", f"NvidiaP2P-{mode}")) == {("GPU0", "GPU0"): "X"}


def test_p2p_raw_modes_parse() -> None:
    # the other modes (n, a, p) were captured raw; their layout is the same
    raw = FIXTURES / "captures" / "h200x2"
    for mode in "nap":
        lines = (raw / f"smi_topo_p2p_{mode}.out").read_text().splitlines()
        matrix = parse_p2p([*lines, "#gpuhost-exit=0"])
        assert matrix is not None and matrix[("GPU0", "GPU1")] in {
            "OK",
            "NS",
            "CNS",
            "GNS",
            "TNS",
            "U",
        }


def test_p2p_rejects_unknown_status_and_mode() -> None:
    with pytest.raises(UnparsedOutput):
        parse_p2p([" \tGPU0\tGPU1\t", " GPU0\tX\tMAYBE\t", "#gpuhost-exit=0"])
    with pytest.raises(ValueError, match="one of r, w, n, a, p"):
        NvidiaP2P().command(mode="x")


def test_driver_version_open_module() -> None:
    driver = parse_driver_version(captured("h200x2", "NvidiaDriver"))
    assert driver is not None
    assert (driver.version, driver.open, driver.gcc_version) == ("580.159.04", True, "15.3.0")
    assert driver.compiler == "gcc version 15.3.0 (GCC)"


def test_driver_version_proprietary_and_absent() -> None:
    lines = [
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.154.05  Thu Dec 28 15:37:48 UTC 2023",
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) ",
    ]
    driver = parse_driver_version(lines)
    assert driver is not None and (driver.open, driver.gcc_version) == (False, "12.2.0")
    assert parse_driver_version([]) is None
    with pytest.raises(UnparsedOutput):
        parse_driver_version(["NVRM something else"])


def test_gpu_information_firmware(machine: str) -> None:
    info = parse_gpu_information(captured(machine, "NvidiaGpuInformation"))
    assert set(info) >= {"0000:00:06.0"}
    for values in info.values():
        assert values["GPU Firmware"] == "580.159.04"
        assert values["Model"] == {"h100x1": "NVIDIA H100 80GB HBM3"}.get(machine, "NVIDIA H200")
    assert parse_gpu_information([]) == {}
