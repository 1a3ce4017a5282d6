"""What the NVIDIA kernel driver (its resource manager, RM) tells libcuda through ioctls, as one
file the twin's stand-in libcuda reads: /proc/driver/gpuhost-twin-rm (twin/libcuda/libcuda.c).

Real libcuda asks the loaded module for its version, the GPUs it drives and their minors, UVM's
state and P2P capability; on the twin those answers are this file, rewritten with every other
kernel view (boot, modprobe, bind/unbind), so it is as true as /proc/driver/nvidia. It sits
beside /proc/driver/nvidia (not in it, so listings of the driver's own tree stay real) and is
absent while nvidia is not loaded. Guests see it through their bind of the twin's /proc/driver.

    version 580.159.04
    uvm_major 238                      (absent while nvidia_uvm is not loaded)
    uvm_disable_hmm Y
    gpu 0000:43:00.0 0 GPU-... NVIDIA RTX PRO 6000 Blackwell Server Edition
    p2p 0000:43:00.0 0000:44:00.0 OK OK 1   (topo -p2p r, w; 1 = P2P DMA corrupts data)
    fabric in_progress                 (NVSwitch boards only; "completed" once configured)

On a board with NVSwitches the driver holds every GPU's fabric state "In Progress" from its
load until nvidia-fabricmanager has configured the switches (NVIDIA's Fabric Manager guide:
"Not Started" -> "In Progress" -> "Completed"); CUDA does not initialise before that
(CUDA_ERROR_SYSTEM_NOT_READY). The state lives in this boot's hw state (``fabric``), set by the
fabric manager's call into the driver (the twin's `gpuhost-twin-fabric`, hwshim/fabric.py).
"""

from __future__ import annotations

from typing import Protocol

RM_FILE = "proc/driver/gpuhost-twin-rm"


class DriverState(Protocol):
    """What the RM file is written from (Hw has it all): the machine's state and profile, the
    loaded modules, the GPUs nvidia drives, and each GPU's IOMMU domain type."""

    state: dict
    profile: dict

    def loaded(self, name: str) -> bool: ...
    def modules(self) -> dict[str, dict]: ...
    def gpus(self) -> list[dict]: ...
    def nvidia_gpus(self) -> list[dict]: ...
    def group_type(self, bdf: str) -> str | None: ...


def rm_text(hw: DriverState) -> str | None:
    """The RM file's text, or None while the nvidia module is not loaded."""
    if not hw.loaded("nvidia"):
        return None
    lines = [f"version {hw.state['nvidia']['version']}"]
    if hw.loaded("nvidia_uvm"):
        params = hw.modules()["nvidia_uvm"]["params"]
        lines.append(f"uvm_major {hw.state['majors']['nvidia-uvm']}")
        lines.append(f"uvm_disable_hmm {params.get('uvm_disable_hmm', 'N')}")
    # A GPU whose RM init failed (FSP boot error) is bound but no CUDA device, as in nvidia-smi.
    gpus = [g for g in hw.nvidia_gpus() if not g["failed"]]
    lines += [f"gpu {g['bdf']} {g['minor']} {g['uuid']} {g['name']}" for g in gpus]
    order = {g["bdf"]: i for i, g in enumerate(hw.gpus())}  # topology rows: profile gpus order
    p2p = hw.profile["topology"]["p2p"]
    for a in gpus:
        for b in gpus:
            if a is b:
                continue
            r, c = order[a["bdf"]], order[b["bdf"]]
            bad = int(p2p_corrupts(hw, a["bdf"], b["bdf"]))
            lines.append(f"p2p {a['bdf']} {b['bdf']} {p2p['r'][r][c]} {p2p['w'][r][c]} {bad}")
    if nvswitches(hw):
        lines.append(f"fabric {hw.state.get('fabric', 'in_progress')}")
    return "".join(line + "\n" for line in lines)


def nvswitches(hw: DriverState) -> list[str]:
    """BDFs of the board's NVSwitches: NVIDIA functions of PCI class 0680 ("other bridge")."""
    return [
        d["bdf"]
        for d in hw.profile["pci_devices"]
        if d["vendor"] == "10de" and d["class"].startswith("0680")
    ]


def p2p_corrupts(hw: DriverState, a: str, b: str) -> bool:
    """SEV-SNP with both GPUs in translated (non-identity) IOMMU domains: P2P DMA between them
    silently corrupts data (docs/hazards.md); an identity domain or no SNP keeps it intact."""
    if not hw.state.get("sev_snp_active"):
        return False
    return all(hw.group_type(bdf) not in (None, "identity") for bdf in (a, b))
