"""The GPUs of a profile made from a capture: nvidia-smi's answers, the driver's per-GPU
information and the topology matrices, read by gpuhost's own parsers (HostFacts)."""

from __future__ import annotations

import re
from typing import Any

from gpuhost.observe import gpus as models
from gpuhost.observe.hostfacts import HostFacts
from twin.profile import P2P_MODES

# nvidia-smi -q "Product Architecture" by gpuhost's architecture names (gpuhost/observe/gpus.py)
ARCHITECTURES = {"ampere": "Ampere", "ada": "Ada Lovelace", "hopper": "Hopper"}
ARCHITECTURES["blackwell"] = "Blackwell"
# Compute capability by chip where nvidia-smi could not answer (CUDA programming guide, "Compute
# Capabilities" table): only for a capture taken without a loaded driver.
COMPUTE_CAP = {"GA100": "8.0", "GH100": "9.0", "GB100": "10.0", "GB110": "10.3"}
_ARCH_CAP = {"ampere": "8.6", "ada": "8.9", "hopper": "9.0", "blackwell": "12.0"}
# Memory of the boards captured so far (h200x1/h200x2: 143771 MiB; kpro6: 97887 MiB), for a
# capture without nvidia-smi's answer; other boards take FALLBACK_MEMORY_MIB.
MEMORY_MIB = {"2335": 143771, "2bb1": 97887}
FALLBACK_MEMORY_MIB = 81920


class Unknown(ValueError):
    """A GPU the capture does not describe well enough; the message names fact and fix."""


def _architecture(compute_cap: str, device: str) -> str | None:
    arch = models.architecture(device)
    if arch:
        return ARCHITECTURES[arch]
    major = compute_cap.split(".")[0]
    by_major = {"8": "Ampere", "9": "Hopper", "10": "Blackwell", "12": "Blackwell"}
    return by_major.get(major)


def cpu_count(affinities: list[str]) -> int | None:
    """The highest CPU named in ``topo -m``'s CPU Affinity cells (``0-31,64-95``), plus one."""
    top = -1
    for cell in affinities:
        for number in re.findall(r"\d+", cell):
            top = max(top, int(number))
    return top + 1 if top >= 0 else None


def gpus(facts: HostFacts, assumed: list[str], cpus: int) -> list[dict[str, Any]]:
    """The profile's ``gpus`` in nvidia-smi's index order (or BDF order without nvidia-smi)."""
    info = facts.gpu_information
    topo = facts.topology
    out: list[dict[str, Any]] = []
    if facts.gpus.gpus:
        for gpu in sorted(facts.gpus.gpus, key=lambda g: g.index):
            arch = _architecture(gpu.compute_cap, gpu.vendor_device.split(":")[1])
            if arch is None:
                raise Unknown(
                    f"fact NvidiaGpus: GPU {gpu.bdf} ({gpu.vendor_device}, compute capability"
                    f" {gpu.compute_cap}) has an architecture gpuhost does not know; add its"
                    " device id to gpuhost/observe/gpus.py"
                )
            entry: dict[str, Any] = {
                "bdf": gpu.bdf,
                "name": gpu.name,
                "architecture": arch,
                "memory_mib": gpu.memory_mib,
                "uuid": gpu.uuid,
                "vbios": gpu.vbios.upper(),
                "compute_cap": gpu.compute_cap,
                "persistence_mode": gpu.persistence_mode,
            }
            out.append(entry)
    else:
        pci_gpus = [d for d in facts.pci.values() if d.is_gpu]
        for dev in pci_gpus:
            model = models.gpu_model(dev.device)
            if model is None:
                raise Unknown(
                    f"fact NvidiaGpus: nvidia-smi could not answer ({facts.gpus.error!r}) and"
                    f" GPU {dev.bdf} (10de:{dev.device}) is not a model gpuhost knows; load the"
                    " NVIDIA driver and capture again (`gpuhost capture`)"
                )
            out.append(
                {
                    "bdf": dev.bdf,
                    "name": model.name,
                    "architecture": ARCHITECTURES[model.architecture],
                    "memory_mib": MEMORY_MIB.get(dev.device, FALLBACK_MEMORY_MIB),
                    "uuid_seed": f"{dev.bdf}",
                    "vbios": "00.00.00.00.00",
                    "compute_cap": COMPUTE_CAP.get(model.chip, _ARCH_CAP[model.architecture]),
                }
            )
        if out:
            assumed.append(
                "gpus[*].memory_mib, uuid, vbios, compute_cap: nvidia-smi could not answer at"
                f" capture ({facts.gpus.error}); names from the PCI device ids, memory from"
                " gpuhost's known boards, UUIDs derived from the BDF, VBIOS 00.00.00.00.00"
            )
    names = [f"GPU{i}" for i in range(len(out))]
    for i, entry in enumerate(out):
        details = info.get(entry["bdf"], {})
        if details.get("IRQ", "").isdigit():
            entry["irq"] = int(details["IRQ"])
        dma = re.match(r"(\d+) bits", details.get("DMA Size", ""))
        if dma:
            entry["dma_bits"] = int(dma[1])
        cpu = topo.cpu_affinity.get(names[i]) if topo else None
        numa = topo.numa_affinity.get(names[i]) if topo else None
        dev = facts.pci.get(entry["bdf"])
        entry["cpu_affinity"] = cpu or f"0-{cpus - 1}"
        if numa is None and topo is None and dev is not None and dev.numa_node is not None:
            numa = dev.numa_node
        entry["numa_affinity"] = "N/A" if numa is None else str(numa)
    blackwell = [e for e in out if e["architecture"] == "Blackwell"]
    for entry in blackwell:
        entry["fsp_fails_on_identity"] = True
    if blackwell:
        assumed.append(
            "gpus[*].fsp_fails_on_identity: true for Blackwell (its FSP cannot boot on an identity"
            " IOMMU domain of an SEV-SNP host: the twin's model of that architecture)"
        )
    if out and topo is None:
        assumed.append(
            f"gpus[*].cpu_affinity: 0-{cpus - 1} and numa_affinity from the PCI NUMA node:"
            " no `nvidia-smi topo -m` in the capture"
        )
    if out:
        assumed.append(
            "gpus[*].serial, pdi, board_id, module_id, part numbers, ecc, mig, fan, temperature,"
            " power: the twin's defaults (no fact reads `nvidia-smi -q`)"
        )
    return out


def topology(facts: HostFacts, gpus: list[dict[str, Any]], assumed: list[str]) -> dict:
    """``topology.links`` and ``topology.p2p``: the captured matrices in GPU index order; what
    was not captured (the n/a/p P2P modes: gpuhost reads r and w) follows the links."""
    names = [f"GPU{i}" for i in range(len(gpus))]
    topo = facts.topology
    numa = {g["bdf"]: g["numa_affinity"] for g in gpus}

    def link(a: int, b: int) -> str:
        if a == b:
            return "X"
        if topo is not None and (names[a], names[b]) in topo.links:
            return topo.links[(names[a], names[b])]
        same = numa[gpus[a]["bdf"]] == numa[gpus[b]["bdf"]]
        return "NODE" if same else "SYS"

    n = len(gpus)
    links = [[link(a, b) for b in range(n)] for a in range(n)]
    if n > 1 and topo is None:
        assumed.append(
            "topology.links: NODE within a NUMA node, SYS across: no `nvidia-smi topo -m`"
        )
    p2p: dict[str, list[list[str]]] = {}
    for mode in P2P_MODES:
        captured = facts.p2p.get(mode)
        if captured is not None and all(
            (names[a], names[b]) in captured for a in range(n) for b in range(n)
        ):
            p2p[mode] = [[captured[(names[a], names[b])] for b in range(n)] for a in range(n)]
            continue
        p2p[mode] = [
            [
                "X" if a == b else _p2p_guess(mode, links[a][b], facts, names[a], names[b])
                for b in range(n)
            ]
            for a in range(n)
        ]
    if n > 1:
        missing = [m for m in P2P_MODES if facts.p2p.get(m) is None]
        if missing:
            assumed.append(
                f"topology.p2p.{{{','.join(missing)}}}: not captured (gpuhost reads modes r and"
                " w); n and a: OK over NVLink (NV#), else as read (r) or NS; p: NS"
            )
    return {"links": links, "p2p": p2p}


def _p2p_guess(mode: str, link: str, facts: HostFacts, a: str, b: str) -> str:
    read = (facts.p2p.get("r") or {}).get((a, b), "NS")
    if mode == "p":
        return "NS"
    if mode in ("n", "a") and link.startswith("NV"):
        return "OK"
    if mode == "n":
        return "NS"
    return read


def nvlink_links(links: list[list[str]]) -> int:
    """NVLinks per GPU: the largest bonded set ``NV<n>`` in the link matrix."""
    counts = [int(cell[2:]) for row in links for cell in row if re.fullmatch(r"NV\d+", cell)]
    return max(counts, default=0)
