"""CUDA as a workload sees it: the driver API probe (gpuhost/probes/cuda_probe.py) run remotely."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from gpuhost.observe.probe import Probe

DEFAULT_SIZES = (4096, 1 << 20, 64 << 20)  # a page, a typical message, a large transfer


@dataclass(frozen=True)
class PeerCopy:
    src: str  # BDF
    dst: str
    peer: bool | None  # the driver lets them map each other; None: a device with itself
    sizes: tuple[tuple[int, bool, int | None], ...]  # (bytes, intact, first bad offset)
    # cuCtxEnablePeerAccess's answer src -> dst and dst -> src (None: not capable, not asked)
    enable: tuple[str | None, str | None] | None = None
    gbps: float | None = None  # at the largest size; None: no size of a MiB or more
    staged_gbps: float | None = None  # the same copy before peer access: staged through the host
    host_staged: bool | None = None  # the copy ran no faster than staged: P2P not really used
    error: str | None = None  # a CUDA error that stopped this pair's check

    @property
    def intact(self) -> bool:
        return all(ok for _, ok, _ in self.sizes)


@dataclass(frozen=True)
class CudaView:
    libcuda: str | None  # the library file the loader resolved (libcuda.so.<version>)
    init: str | None  # cuInit's result name; None: libcuda could not be loaded
    driver_api: int | None
    devices: tuple[str, ...]  # BDFs in CUDA order
    names: tuple[str, ...]
    copies: tuple[PeerCopy, ...] = ()
    error: str | None = None
    sizes: tuple[int, ...] = field(default=DEFAULT_SIZES)

    @property
    def userspace_version(self) -> str | None:
        if self.libcuda and ".so." in self.libcuda:
            return self.libcuda.rsplit(".so.", 1)[1]
        return None


def parse_cuda_probe(lines: list[str], sizes: tuple[int, ...] = DEFAULT_SIZES) -> CudaView | None:
    text = "\n".join(lines).strip()
    if not text:
        return None
    try:
        data: dict[str, Any] = json.loads(text.splitlines()[-1])
    except ValueError:
        # The probe died (a crash inside libcuda, a python too old): that is a finding.
        return CudaView(None, None, None, (), (), error=f"the CUDA probe failed: {text[-400:]}")
    copies = tuple(_peer_copy(c) for c in data.get("copies", []))
    return CudaView(
        libcuda=data.get("libcuda"),
        init=data.get("init"),
        driver_api=data.get("driver_api"),
        devices=tuple(d["bdf"] for d in data.get("devices", [])),
        names=tuple(d["name"] for d in data.get("devices", [])),
        copies=copies,
        error=data.get("error"),
        sizes=tuple(sizes),
    )


def _peer_copy(c: dict[str, Any]) -> PeerCopy:
    enable = c.get("enable")
    return PeerCopy(
        c["from"],
        c["to"],
        c["peer"],
        tuple((s["bytes"], s["ok"], s["first_bad_offset"]) for s in c["sizes"]),
        enable=(enable[0], enable[1]) if enable else None,
        gbps=c.get("gbps"),
        staged_gbps=c.get("staged_gbps"),
        host_staged=c.get("host_staged"),
        error=c.get("error"),
    )


def probe_source() -> str:
    return resources.files("gpuhost.probes").joinpath("cuda_probe.py").read_text()


class CudaProbe(Probe["CudaView | None"]):
    """
    Returns what CUDA sees through the driver API (cuInit, devices, peer copies checked byte
    for byte), or None where python3 is missing. The probe travels inside the command.
    """

    requires_command = "python3"

    def command(self, sizes: tuple[int, ...] = DEFAULT_SIZES) -> str:
        code = base64.b64encode(probe_source().encode()).decode()
        args = " ".join(str(int(s)) for s in sizes)
        return f"echo {code} | base64 -d | python3 - {args} 2>&1"

    def process(self, output: list[str]) -> CudaView | None:
        return parse_cuda_probe(output)
