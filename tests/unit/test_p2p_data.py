"""The P2P data check on the probe's per-pair evidence (gpuhost/audit/p2p_checks.py): where the
Plan expects P2P, a pair whose copies ran at host-staged speed, or whose peer access was refused
(CUDA_ERROR_TOO_MANY_PEERS), fails; where it does not, the same evidence is only recorded.
The probe output's shape is the one tests/twin/test_cuda.py gets from the probe on twins; the
parser also reads the real H200's output from before the probe measured bandwidth.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from gpuhost.audit.p2p_checks import data_findings
from gpuhost.observe.cuda import parse_cuda_probe

A, B = "0000:43:00.0", "0000:44:00.0"
OK = ["CUDA_SUCCESS", "CUDA_SUCCESS"]


def copy(src, dst, **over):
    record = {
        "from": src,
        "to": dst,
        "peer": None if src == dst else True,
        "enable": None if src == dst else OK,
        "sizes": [{"bytes": 67108864, "ok": True, "first_bad_offset": None}],
        "gbps": 48.1,
        "staged_gbps": None if src == dst else 11.9,
        "host_staged": None if src == dst else False,
        "error": None,
    }
    return record | over


def view(there, back):
    copies = [copy(A, A), copy(B, B), copy(A, B, **there), copy(B, A, **back)]
    out = {
        "libcuda": "/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04",
        "init": "CUDA_SUCCESS",
        "driver_api": 13000,
        "devices": [{"bdf": A, "name": "NVIDIA H200"}, {"bdf": B, "name": "NVIDIA H200"}],
        "copies": copies,
        "error": None,
    }
    return parse_cuda_probe([json.dumps(out)])


def ctx(expected: bool | None):
    facts = SimpleNamespace(
        cmdline=["quiet"],
        iommu=SimpleNamespace(group_types={}),
        sev=SimpleNamespace(snp_host=False),
    )
    return SimpleNamespace(
        plan=SimpleNamespace(p2p={(A, B): expected}), host=SimpleNamespace(facts=facts)
    )


def findings(expected, there, back=None):
    details: dict = {}
    found = data_findings(ctx(expected), "host", view(there, back or {}), [A, B], details)
    return found, details


def test_p2p_that_beats_staging_passes_and_is_recorded():
    found, details = findings(True, {})
    assert found == []
    pair = next(c for c in details["copies"] if (c["from"], c["to"]) == (A, B))
    assert (pair["gbps"], pair["staged_gbps"], pair["host_staged"]) == (48.1, 11.9, False)
    assert pair["enable"] == OK


def test_host_staged_pair_fails_where_p2p_is_expected():
    staged = {"gbps": 12.0, "host_staged": True}
    found, _ = findings(True, staged)
    assert [f.subject for f in found] == [f"P2P {A} -> {B} on host"]
    assert "12.0 GB/s with peer access, 11.9 GB/s staged" in found[0].found
    assert "ACS" in found[0].fix
    # the same evidence where P2P is not expected (or not relied on) is no finding
    no_peer = {"peer": False, "enable": [None, None], **staged}
    assert findings(False, no_peer, no_peer)[0] == []
    assert findings(None, staged)[0] == []


def test_too_many_peers_fails_that_pair_with_its_cause():
    refused = {"enable": ["CUDA_ERROR_TOO_MANY_PEERS"] * 2, "gbps": 12.0, "host_staged": True}
    found, _ = findings(True, refused, refused)
    assert [f.subject for f in found] == [f"P2P {A} -> {B} on host", f"P2P {B} -> {A} on host"]
    assert found[0].found == (
        f"refused {A} -> {B}: CUDA_ERROR_TOO_MANY_PEERS; {B} -> {A}: CUDA_ERROR_TOO_MANY_PEERS"
    )
    assert "eight peer connections" in found[0].fix


def test_a_pair_stopped_by_a_cuda_error_fails_alone():
    broken = {"error": "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY", "sizes": [], "gbps": None}
    found, _ = findings(True, broken, {})
    assert [(f.subject, f.found) for f in found] == [
        (f"P2P {A} -> {B} on host", "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY")
    ]


def test_real_output_from_before_the_bandwidth_fields_parses():
    """tests/fixtures/captures/h200x1-audit: the probe on a real 1x H200 (2026-12-01)."""
    out = Path(__file__).parents[1] / "fixtures/captures/h200x1-audit/cuda_probe.out"
    real = parse_cuda_probe(out.read_text().splitlines())
    (self_copy,) = real.copies
    assert (self_copy.src, self_copy.dst, self_copy.peer) == ("0000:00:06.0",) * 2 + (None,)
    assert self_copy.intact and [n for n, _, _ in self_copy.sizes] == [4096, 1 << 20, 64 << 20]
    assert (self_copy.enable, self_copy.gbps, self_copy.host_staged, self_copy.error) == (
        None,
        None,
        None,
        None,
    )


def test_real_output_of_todays_probe_parses():
    """tests/fixtures/captures/h200x1-p2p: this probe on a real 1x H200 (2026-12-03): the self
    copy is timed (no pair there, so no peer access or host-staged reference)."""
    out = Path(__file__).parents[1] / "fixtures/captures/h200x1-p2p/cuda_probe.out"
    real = parse_cuda_probe(out.read_text().splitlines())
    (self_copy,) = real.copies
    assert self_copy.intact and self_copy.error is None
    assert self_copy.gbps is not None and self_copy.gbps > 100  # device memory, not PCIe
    assert (self_copy.enable, self_copy.host_staged) == (None, None)
