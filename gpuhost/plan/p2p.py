"""Which GPU pairs may do peer-to-peer DMA, and what GPU guests' NCCL must be told. Pure.

The truth about P2P is the driver's own answer, ``nvidia-smi topo -p2p r`` and ``w`` (facts
NvidiaP2P): a pair is expected to do P2P when both directions answer OK for reads and writes.
The link type of ``topo -m`` is not the answer (single-socket EPYC boards report OK across NODE
links); it only goes into the notes.

Where the IOMMU translates P2P DMA unsafely, P2P is not relied on whatever the driver says:
on an SEV-SNP host whose host-driver GPUs stay in translated (DMA/DMA-FQ) domains, P2P DMA
silently corrupted data, or wherever the spec says so (p2p.unsafe_iommu). Then every guest
that owns more than one GPU gets NCCL_P2P_DISABLE=1.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

_STATUS = {
    "OK": "OK",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "U": "unknown",
}
_SAME_SWITCH = ("PIX", "PXB", "PHB")


@dataclass(frozen=True)
class P2PPlan:
    ordered: dict[
        tuple[str, str], bool | None
    ]  # (from BDF, to BDF) -> expected; None: not relied on
    pairs: dict[tuple[str, str], bool | None]  # (lower BDF, higher BDF): both directions
    env: dict[Hashable, dict[str, str]] = field(default_factory=dict)  # owner -> additions
    notes: tuple[str, ...] = ()


def plan_p2p(
    *,
    gpus: Sequence[tuple[str, Hashable, bool]],
    smi_names: Mapping[str, str],
    read: Mapping[tuple[str, str], str] | None,
    write: Mapping[tuple[str, str], str] | None,
    links: Mapping[tuple[str, str], str] | None = None,
    expected: str = "auto",
    unsafe_iommu: bool = False,
    snp_host: bool = False,
    identity_domains: bool = False,
    host: Hashable | None = None,
) -> P2PPlan:
    """Expected P2P between GPUs of one owner that stay on the nvidia driver.

    ``gpus``: (BDF, owner, stays on the nvidia driver) for every GPU. ``smi_names``: BDF ->
    nvidia-smi name (GPU0...) from facts NvidiaGpus. ``read``/``write``: the topo -p2p r/w
    matrices (None when nvidia-smi could not answer). ``links``: topo -m links, for notes.
    ``identity_domains``: the IOMMU plan's answer (iommu=pt in effect after the next boot).
    ``host``: the owner that stands for the host itself; it gets no guest environment.
    """
    if expected not in ("auto", "none", "all"):
        raise ValueError(f"p2p.expected must be auto, none or all, not {expected!r}")
    notes: list[str] = []
    by_owner: dict[Hashable, list[str]] = {}
    for bdf, owner, _ in gpus:
        by_owner.setdefault(owner, []).append(bdf)
    on_nvidia = {bdf for bdf, _, nvidia in gpus if nvidia}
    pairs = [
        (a, b)
        for bdfs in by_owner.values()
        for a, b in combinations(sorted(bdfs), 2)
        if a in on_nvidia and b in on_nvidia
    ]
    ordered_keys = [*pairs, *((b, a) for a, b in pairs)]

    env: dict[Hashable, dict[str, str]] = {}
    unsafe = unsafe_iommu or (snp_host and not identity_domains)
    if unsafe:
        why = (
            "p2p.unsafe_iommu is set"
            if unsafe_iommu
            else "SEV-SNP keeps host GPUs in translated IOMMU domains, where P2P DMA corrupted data"
        )
        owners = [o for o, bdfs in by_owner.items() if len(bdfs) > 1 and o != host]
        env = {o: {"NCCL_P2P_DISABLE": "1"} for o in owners}
        notes.append(
            f"P2P is not relied on: {why}"
            + ("; guests with several GPUs get NCCL_P2P_DISABLE=1" if owners else "")
        )
        return _result(dict.fromkeys(ordered_keys), env, notes)
    if expected != "auto":
        return _result(dict.fromkeys(ordered_keys, expected == "all"), env, notes)
    if not pairs:
        return _result({}, env, notes)
    known = all(bdf in smi_names for pair in pairs for bdf in pair)
    if read is None or write is None or not known:
        notes.append(
            "P2P: unknown until the nvidia driver runs every GPU that stays on it "
            "(nvidia-smi topo -p2p); re-plan after boot"
        )
        return _result(dict.fromkeys(ordered_keys), env, notes)

    ordered: dict[tuple[str, str], bool | None] = {}
    for a, b in ordered_keys:
        key = (smi_names[a], smi_names[b])
        answers = (read.get(key), write.get(key))
        if None in answers:
            ordered[(a, b)] = None
            notes.append(f"P2P {key[0]}->{key[1]}: the driver gave no answer; not checked")
            continue
        ordered[(a, b)] = answers == ("OK", "OK")
    expected_no: list[str] = []  # plain NS across host bridges/sockets: what the links say too
    for a, b in pairs:
        names = (smi_names[a], smi_names[b])
        link = (links or {}).get(names)
        ok = ordered[(a, b)] and ordered[(b, a)]
        over = f" over a {link} link" if link else ""
        plain_ns = {read.get((x, y)) for x, y in (names, names[::-1])} | {
            write.get((x, y)) for x, y in (names, names[::-1])
        } == {"NS"}
        if not ok and plain_ns and link in ("NODE", "SYS"):
            expected_no.append(f"{names[0]}<->{names[1]} ({link})")
        elif not ok:
            said = "; ".join(
                f"{x}->{y} read {_STATUS.get(read.get((x, y)) or 'U')}, "
                f"write {_STATUS.get(write.get((x, y)) or 'U')}"
                for x, y in (names, names[::-1])
            )
            notes.append(f"P2P {names[0]}<->{names[1]}{over}: the driver reports {said}")
        elif link and not link.startswith("NV") and link not in _SAME_SWITCH:
            notes.append(
                f"P2P {names[0]}<->{names[1]}: the driver reports OK{over} (the link type alone "
                "would not say so)"
            )
    if expected_no:
        notes.append(
            f"P2P not supported by the driver for {len(expected_no)} pair(s), all across host "
            f"bridges or sockets: {', '.join(expected_no)}"
        )
    return _result(ordered, env, notes)


def _result(
    ordered: dict[tuple[str, str], bool | None],
    env: dict[Hashable, dict[str, str]],
    notes: list[str],
) -> P2PPlan:
    pairs: dict[tuple[str, str], bool | None] = {}
    for a, b in ordered:
        if a < b:
            there, back = ordered[(a, b)], ordered.get((b, a))
            pairs[(a, b)] = None if None in (there, back) else bool(there and back)
    return P2PPlan(ordered=ordered, pairs=pairs, env=env, notes=tuple(notes))
