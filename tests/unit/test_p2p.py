"""Expected P2P from the driver's own answers (nvidia-smi topo -p2p r/w)."""

from typing import Any

import pytest

from gpuhost.observe.nvidia import parse_gpu_query, parse_p2p, parse_topology
from gpuhost.plan.p2p import plan_p2p
from tests.unit.conftest import captured

A, B = "0000:00:06.0", "0000:00:07.0"


def h200x2(**kw: Any) -> Any:
    """The real 2x H200 NVLink capture: both GPUs on nvidia, one owner."""
    gpus = parse_gpu_query(captured("h200x2", "NvidiaGpus")).gpus
    topology = parse_topology(captured("h200x2", "NvidiaTopology"))
    args: dict[str, Any] = {
        "gpus": [(A, "ct200", True), (B, "ct200", True)],
        "smi_names": {g.bdf: f"GPU{g.index}" for g in gpus},
        "read": parse_p2p(captured("h200x2", "NvidiaP2P-r")),
        "write": parse_p2p(captured("h200x2", "NvidiaP2P-w")),
        "links": topology.links if topology else None,
    }
    return plan_p2p(**{**args, **kw})


def test_real_h200_pair_over_nvlink() -> None:
    result = h200x2()
    assert result.pairs == {(A, B): True} and result.ordered == {(A, B): True, (B, A): True}
    assert result.env == {} and result.notes == ()


def test_only_pairs_of_one_owner_on_the_nvidia_driver() -> None:
    assert h200x2(gpus=[(A, "ct200", True), (B, "ct201", True)]).pairs == {}
    assert h200x2(gpus=[(A, "vm129", False), (B, "vm129", False)]).pairs == {}


def test_snp_with_translated_domains_is_not_relied_on() -> None:
    result = h200x2(snp_host=True, identity_domains=False)
    assert result.pairs == {(A, B): None}
    assert result.env == {"ct200": {"NCCL_P2P_DISABLE": "1"}}
    # a VM with two GPUs gets it too (its P2P goes through the IOMMU as well); the host does not
    vm = h200x2(gpus=[(A, "vm1", False), (B, "vm1", False)], snp_host=True)
    assert vm.env == {"vm1": {"NCCL_P2P_DISABLE": "1"}} and vm.pairs == {}
    host = h200x2(gpus=[(A, "host", True), (B, "host", True)], snp_host=True, host="host")
    assert host.env == {} and host.pairs == {(A, B): None}
    # SNP given up for iommu=pt: the driver's answer stands
    assert h200x2(snp_host=True, identity_domains=True).pairs == {(A, B): True}


def test_unsafe_iommu_and_overrides() -> None:
    assert h200x2(unsafe_iommu=True).pairs == {(A, B): None}
    assert h200x2(expected="none").pairs == {(A, B): False}
    assert h200x2(expected="all", read=None, write=None).pairs == {(A, B): True}
    with pytest.raises(ValueError):
        h200x2(expected="some")


def test_unknown_without_the_driver() -> None:
    result = h200x2(read=None)
    assert result.pairs == {(A, B): None} and "re-plan after boot" in result.notes[0]
    assert h200x2(smi_names={A: "GPU0"}).pairs == {(A, B): None}  # B not on nvidia now


def test_driver_answer_not_link_type() -> None:
    # kpro6 shape: GPU0/GPU1 across host bridges (NODE) but the driver says OK; GPU0/GPU4
    # across sockets (SYS) with the chipset refusing
    c, d = "0000:81:00.0", "0000:c1:00.0"
    names = {A: "GPU0", B: "GPU1", c: "GPU4"}
    status = {("GPU0", "GPU1"): "OK", ("GPU1", "GPU0"): "OK"}
    status |= {("GPU0", "GPU4"): "CNS", ("GPU4", "GPU0"): "CNS"}
    links = {("GPU0", "GPU1"): "NODE", ("GPU0", "GPU4"): "SYS"}
    result = plan_p2p(
        gpus=[(A, "ct", True), (B, "ct", True), (c, "ct2", True), (d, "ct2", False)],
        smi_names=names,
        read=status,
        write=status,
        links=links,
    )
    assert result.pairs == {(A, B): True}
    assert any("NODE" in n and "reports OK" in n for n in result.notes)
    other = plan_p2p(
        gpus=[(A, "ct", True), (c, "ct", True)],
        smi_names=names,
        read=status,
        write=status,
        links=links,
    )
    assert other.pairs == {(A, c): False}
    assert any("SYS" in n and "chipset not supported" in n for n in other.notes)


def test_one_direction_refused_means_no_pair() -> None:
    names = {A: "GPU0", B: "GPU1"}
    read = {("GPU0", "GPU1"): "OK", ("GPU1", "GPU0"): "OK"}
    write = {("GPU0", "GPU1"): "OK", ("GPU1", "GPU0"): "NS"}
    result = plan_p2p(gpus=[(A, 1, True), (B, 1, True)], smi_names=names, read=read, write=write)
    assert result.ordered == {(A, B): True, (B, A): False} and result.pairs == {(A, B): False}


def test_plain_not_supported_across_bridges_is_one_summary_note() -> None:
    """The expected case (NS both ways over NODE/SYS) gives one note, not one per pair."""
    bdfs = ["0000:01:00.0", "0000:21:00.0", "0000:81:00.0"]
    names = {bdf: f"GPU{i}" for i, bdf in enumerate(bdfs)}
    status = {(x, y): "X" if x == y else "NS" for x in names.values() for y in names.values()}
    links = {(x, y): "X" if x == y else "NODE" for x in names.values() for y in names.values()}
    links[("GPU0", "GPU2")] = links[("GPU2", "GPU0")] = "SYS"
    result = plan_p2p(
        gpus=[(bdf, "ct", True) for bdf in bdfs],
        smi_names=names,
        read=status,
        write=status,
        links=links,
    )
    assert set(result.pairs.values()) == {False}
    assert result.notes == (
        "P2P not supported by the driver for 3 pair(s), all across host bridges or sockets: "
        "GPU0<->GPU1 (NODE), GPU0<->GPU2 (SYS), GPU1<->GPU2 (NODE)",
    )
