"""The host spec's guests: LXC containers and VMs that get GPUs, by PCI address or nvidia-smi
index (kept apart from spec.py, which assembles the host's spec)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag

from gpuhost.redact import show
from gpuhost.values import (
    MAX_GPU_INDEX,
    MAX_ITEMS,
    AbsPath,
    CudaVersion,
    DnsName,
    EnvName,
    EnvValue,
    Hostname,
    MachineType,
    PipRequirement,
    PythonVersion,
    Username,
    normalize_bdf,
)


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _gpu_ref(value: object) -> object:
    if type(value) is int:
        if not 0 <= value <= MAX_GPU_INDEX:
            raise ValueError(
                f"GPU index {value} is out of range; nvidia-smi indexes start at 0 "
                f"(at most {MAX_GPU_INDEX})"
            )
        return value
    if isinstance(value, str):
        return normalize_bdf(value)
    raise ValueError(
        f"{show(value)} is not a GPU; give a PCI address string ('0000:41:00.0') or an "
        "nvidia-smi index (an int; true/false and floats are not indexes)"
    )


GpuRef = Annotated[
    int | str,
    BeforeValidator(_gpu_ref),
    Field(description="A GPU by PCI address (BDF) or nvidia-smi index."),
]


def _gpus_tag(value: object) -> str:
    return "rest" if isinstance(value, str) else "list"


GpuList = Annotated[
    Annotated[list[GpuRef], Tag("list"), Field(max_length=MAX_GPU_INDEX + 1)]
    | Annotated[Literal["rest"], Tag("rest")],
    Discriminator(
        _gpus_tag,
        custom_error_type="gpu_list",
        custom_error_message="give a list of PCI addresses/nvidia-smi indexes, or 'rest'",
    ),
]


class Venv(Model):
    """A uv virtual environment in a guest (filled in by the CUDA/venv issue)."""

    path: AbsPath = Field(description="Absolute, normalised path of the venv in the guest.")
    python: PythonVersion = Field("3.12", description="Python version uv installs for it.")
    cuda: CudaVersion | None = Field(
        None, description="CUDA toolkit this venv builds against (sets CUDA_HOME)."
    )
    packages: list[PipRequirement] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Requirements to install (PEP 508; no credentials in URLs).",
    )
    constraints: list[PipRequirement] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Pins every install must honour, e.g. 'torch==2.9.1' (PEP 508).",
    )


class GuestBase(Model):
    name: DnsName = Field(
        description="Guest name (container hostname / VM name): a lowercase DNS name."
    )
    gpus: GpuList = Field(
        default_factory=list,
        description="GPUs for this guest: BDFs ('0000:41:00.0'), nvidia-smi indexes, or 'rest' "
        "for every GPU no other guest names.",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="Environment for GPU workloads in the guest (e.g. NCCL_P2P_DISABLE). Names "
        "[A-Za-z_][A-Za-z0-9_]*; values printable ASCII without quotes, backslashes, $, "
        "backticks, % or control characters, no leading/trailing space, up to 4096 characters.",
    )


class LxcAccess(Model):
    """How pyinfra/testinfra reach the container itself."""

    ssh_hostname: Hostname | None = Field(
        None, description="Address to SSH to; None: reach it through `pct exec` on the host."
    )
    ssh_user: Username = Field("root", description="SSH user in the container.")
    ssh_port: int = Field(22, ge=1, le=65535, description="SSH port.")


GuestId = Annotated[int, Field(ge=100, le=999_999_999)]


class LxcGuest(GuestBase):
    """An LXC container that uses GPUs through the host's nvidia driver (bind-mounted nodes)."""

    kind: Literal["lxc"] = "lxc"
    ctid: GuestId = Field(description="Container id (pct).")
    access: LxcAccess = Field(default_factory=LxcAccess, description="How to reach the container.")
    devices: Literal["devN", "raw"] = Field(
        "devN",
        description="How GPU device nodes are granted: 'devN' (Proxmox resolves majors at "
        "start, PVE >= 8.1) or 'raw' (lxc.cgroup2 rules written from the live majors).",
    )
    privileged: bool = Field(
        False,
        description="The container may run privileged (no `unprivileged: 1`). The audit fails a "
        "privileged GPU container unless this says so.",
    )
    cuda: list[CudaVersion] = Field(
        default_factory=list,
        max_length=16,
        description="CUDA toolkits to install side by side, e.g. ['12.8', '13.0'].",
    )
    venvs: list[Venv] = Field(
        default_factory=list, max_length=64, description="uv venvs to create."
    )

    @property
    def guest_id(self) -> int:
        return self.ctid


class VmGuest(GuestBase):
    """A QEMU VM that gets whole GPUs through vfio-pci passthrough (hostpciN)."""

    kind: Literal["vm"] = "vm"
    vmid: GuestId = Field(description="VM id (qm).")
    machine: MachineType | None = Field(
        None,
        description="Machine type to set: 'q35', 'pc-q35-X.Y' or 'pc-q35-X.Y+pveN' ('pc', "
        "'pc-i440fx-X.Y' only for a VM without GPUs). None keeps the VM's configured type, which "
        "must then already be q35 for GPU passthrough.",
    )

    @property
    def guest_id(self) -> int:
        return self.vmid


Guest = Annotated[LxcGuest | VmGuest, Field(discriminator="kind")]
GUEST_KINDS: dict[str, type[GuestBase]] = {"lxc": LxcGuest, "vm": VmGuest}
