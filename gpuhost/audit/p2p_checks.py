"""P2P: the driver's answers against the Plan, and data really copied between GPUs.

P2P failed on a real host as silent corruption (SEV-SNP, translated IOMMU domains), not as an
error, so besides the driver's `topo -p2p r/w` answers the audit copies random buffers between
every ordered pair of GPUs that share an owner (cuMemcpyPeer, gpuhost/probes/cuda_probe.py) and
compares them byte for byte, on the host and inside each GPU container. Each result is recorded
with the IOMMU parameters and domain types that produced it.

A copy between GPUs arrives whether or not P2P carried it (without peer access the driver stages
it through host memory), so where P2P is expected the probe's per-pair evidence must show it was
used: peer access enabled in both directions, and a bandwidth above the same copy staged through
the host (gpuhost/probes/cuda_probe.py measures both).
"""

from __future__ import annotations

from typing import Any

from gpuhost.audit.context import REDEPLOY, AuditContext
from gpuhost.audit.model import Finding, NotApplicable, check
from gpuhost.observe.cuda import CudaView, PeerCopy

IOMMU_PARAMS = ("iommu", "amd_iommu", "intel_iommu", "iommu.passthrough", "iommu.strict")


def expected_pairs(
    ctx: AuditContext, bdfs: list[str] | None = None
) -> dict[tuple[str, str], bool | None]:
    """Ordered pairs (from, to) of GPUs that share an owner -> P2P expected (None: unsafe)."""
    pairs: dict[tuple[str, str], bool | None] = {}
    for (a, b), want in ctx.plan.p2p.items():
        if bdfs is None or (a in bdfs and b in bdfs):
            pairs[(a, b)] = pairs[(b, a)] = want
    return pairs


def iommu_record(ctx: AuditContext) -> dict[str, Any]:
    facts = ctx.host.facts
    params = [
        p
        for p in facts.cmdline
        if p.split("=", 1)[0] in IOMMU_PARAMS or p.startswith("pcie_acs_override")
    ]
    return {
        "cmdline": params,
        "domain_types": sorted(set(facts.iommu.group_types.values())),
        "sev_snp_host": facts.sev.snp_host,
    }


def topology_findings(ctx: AuditContext) -> list[Finding]:
    """The driver's r/w answers and link classes for every pair against the Plan."""
    pairs = expected_pairs(ctx)
    if not pairs:
        raise NotApplicable("no owner has two GPUs on the nvidia driver")
    facts, findings = ctx.host.facts, []
    names = {g.bdf: f"GPU{g.index}" for g in facts.gpus.gpus}
    link_wanted = ctx.spec.p2p.link
    for (a, b), want in sorted(pairs.items()):
        label = f"{names.get(a, a)} -> {names.get(b, b)} ({a} -> {b})"
        answers = {mode: (facts.p2p.get(mode) or {}).get((a, b)) for mode in ("r", "w")}
        works = all(v == "OK" for v in answers.values())
        if want is not None and works != want:
            findings.append(
                Finding(
                    label,
                    "P2P read and write OK" if want else "no P2P",
                    f"topo -p2p r {answers['r']}, w {answers['w']}",
                    "the board or BIOS changed (ACS, IOMMU): check `nvidia-smi topo -p2p r`, or "
                    "correct p2p.expected",
                )
            )
        if link_wanted and a < b:
            link = facts.topology.links.get((a, b)) if facts.topology else None
            if link != link_wanted:
                findings.append(
                    Finding(
                        label,
                        f"link {link_wanted} (p2p.link)",
                        f"link {link}",
                        "check NVLink (`nvidia-smi nvlink -s`) and fabric manager, or correct "
                        "p2p.link",
                    )
                )
    return findings


def p2p_use_findings(copy: PeerCopy, where: str) -> list[Finding]:
    """Where P2P is expected: the probe enabled peer access both ways and the copy beat staging."""
    subject = f"P2P {copy.src} -> {copy.dst} on {where}"
    if copy.error:
        return [Finding(subject, "the copy check runs", copy.error, "check dmesg (NVRM, Xid)")]
    ways = ((copy.src, copy.dst), (copy.dst, copy.src))
    refused = [
        f"{a} -> {b}: {name or 'not capable (cuDeviceCanAccessPeer)'}"
        for (a, b), name in zip(ways, copy.enable or ("CUDA_SUCCESS",) * 2, strict=True)
        if name != "CUDA_SUCCESS"
    ]
    if refused:
        too_many = any("TOO_MANY_PEERS" in r for r in refused)
        return [
            Finding(
                subject,
                "peer access enabled in both directions (cuCtxEnablePeerAccess)",
                "refused " + "; ".join(refused),
                "a GPU without NVSwitch has at most eight peer connections across all processes: "
                "stop the workload that holds them and re-run the audit, or give this owner fewer "
                "GPUs"
                if too_many
                else "check the driver and the IOMMU mode (`nvidia-smi topo -p2p r`)",
            )
        ]
    if copy.host_staged:
        return [
            Finding(
                subject,
                "faster than the same copy staged through host memory",
                f"{copy.gbps} GB/s with peer access, {copy.staged_gbps} GB/s staged: P2P is not "
                "used",
                "check that ACS redirect and the IOMMU leave P2P direct (`lspci -vvv` ACSCtl, "
                "iommu=pt), and NVLink (`nvidia-smi nvlink -s`), or correct p2p.expected",
            )
        ]
    return []


def data_findings(
    ctx: AuditContext, where: str, view: CudaView | None, bdfs: list[str], details: dict[str, Any]
) -> list[Finding]:
    """Copies seen by the probe on ``where`` between ``bdfs`` (and each with itself)."""
    if not bdfs:
        raise NotApplicable(f"no GPU on the nvidia driver for {where}")
    if view is None:
        raise NotApplicable(f"python3 is missing on {where}: the copy check needs it")
    if view.init != "CUDA_SUCCESS":
        raise NotApplicable(f"CUDA does not initialise on {where} (the cuda check says why)")
    pairs = expected_pairs(ctx, bdfs)
    details["iommu"] = iommu_record(ctx)
    details["copies"] = []
    findings = []
    by_pair = {(c.src, c.dst): c for c in view.copies}
    wanted = [(b, b) for b in bdfs] + sorted(pairs)
    for src, dst in wanted:
        copy = by_pair.get((src, dst))
        want = True if src == dst else pairs[(src, dst)]
        record = {"from": src, "to": dst, "expected_p2p": want}
        if copy is None:
            if src in view.devices and dst in view.devices:
                findings.append(Finding(f"{src} -> {dst}", "a copy", "not run", "re-run the audit"))
            details["copies"].append({**record, "result": "not visible to CUDA"})
            continue
        record |= {
            "peer_access": copy.peer,
            "enable": list(copy.enable) if copy.enable else None,
            "sizes": [
                {"bytes": n, "intact": ok, "first_bad_offset": off} for n, ok, off in copy.sizes
            ],
            "gbps": copy.gbps,
            "staged_gbps": copy.staged_gbps,
            "host_staged": copy.host_staged,
            "error": copy.error,
        }
        details["copies"].append(record)
        if want is None:
            continue  # P2P is not relied on here: the guests' NCCL is told so instead
        bad = [f"{n} B (first bad byte at {off})" for n, ok, off in copy.sizes if not ok]
        if bad:
            findings.append(
                Finding(
                    f"copy {src} -> {dst} on {where}",
                    "every byte intact",
                    "corrupted: " + ", ".join(bad),
                    "P2P DMA is corrupting data: set p2p.unsafe_iommu (NCCL_P2P_DISABLE=1 for "
                    f"the guests) or give the GPUs identity domains (iommu=pt); {REDEPLOY}",
                )
            )
        if src != dst and want and copy.peer:
            findings += p2p_use_findings(copy, where)
        if src != dst and copy.peer is not want:
            findings.append(
                Finding(
                    f"{src} -> {dst} on {where}",
                    "peer access " + ("allowed" if want else "refused") + " (as topo -p2p said)",
                    "peer access "
                    + ("allowed" if copy.peer else "refused")
                    + " (cuDeviceCanAccessPeer)",
                    "CUDA and nvidia-smi disagree: check the driver and the IOMMU mode",
                )
            )
    return findings


def unsafe_env_findings(
    ctx: AuditContext, where: str, bdfs: list[str], env: dict[str, str]
) -> list[Finding]:
    """Where P2P is not safe between a guest's GPUs, its NCCL must be told to not use it."""
    pairs = expected_pairs(ctx, bdfs)
    if not any(v is None for v in pairs.values()):
        return []
    if env.get("NCCL_P2P_DISABLE") != "1":
        return [
            Finding(
                f"NCCL_P2P_DISABLE on {where}",
                "1 (P2P is unsafe here: IOMMU translation)",
                env.get("NCCL_P2P_DISABLE", "unset"),
                f"{REDEPLOY}: it manages the guests' environment",
            )
        ]
    return []


@check("p2p.topology", "topo -p2p r/w and link classes equal what the Plan expects")
def p2p_topology(ctx: AuditContext) -> list[Finding]:
    return topology_findings(ctx)


def _host_gpus(ctx: AuditContext) -> list[str]:
    return [a.bdf for a in ctx.plan.gpus if a.driver_planned == "nvidia"]


def cuda_findings(where: str, view: Any, bdfs: list[str], fix_hint: str) -> list[Finding]:
    cuda = view.cuda if view is not None else None
    if cuda is None:
        raise NotApplicable(f"python3 is missing on {where}: the CUDA check needs it")
    if cuda.init is None:
        return [
            Finding(f"CUDA on {where}", "libcuda.so.1 loads", cuda.error or "it does not", fix_hint)
        ]
    if cuda.init != "CUDA_SUCCESS":
        return [Finding(f"cuInit on {where}", "CUDA_SUCCESS", cuda.init, fix_hint)]
    findings = []
    if sorted(cuda.devices) != sorted(bdfs):
        findings.append(
            Finding(
                f"CUDA devices on {where}",
                ", ".join(sorted(bdfs)) or "none",
                ", ".join(sorted(cuda.devices)) or "none",
                fix_hint,
            )
        )
    if cuda.error:
        findings.append(Finding(f"CUDA on {where}", "no error", cuda.error, fix_hint))
    return findings


@check("cuda.host", "CUDA initialises on the host and sees every GPU left on nvidia")
def cuda_host(ctx: AuditContext) -> list[Finding]:
    bdfs = _host_gpus(ctx)
    if not bdfs:
        raise NotApplicable("no GPU stays on the nvidia driver")
    return cuda_findings(ctx.name, ctx.host, bdfs, "check the driver (driver.*) and dmesg (NVRM)")


@check("p2p.data", "Peer copies between GPUs that share an owner come back intact (on the host)")
def p2p_data(ctx: AuditContext) -> list[Finding]:
    details = ctx.details_for("p2p.data")
    return data_findings(ctx, ctx.name, ctx.host.cuda, _host_gpus(ctx), details)
