"""The host spec's guests: LXC containers and VMs that get GPUs, by PCI address or nvidia-smi
index (kept apart from spec.py, which assembles the host's spec)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)

from gpuhost.redact import show
from gpuhost.spec.guest_values import AptUrl, IndexUrl, PipRequirement, PyModule, ServiceArg
from gpuhost.spec.values import (
    MAX_GPU_INDEX,
    MAX_ITEMS,
    AbsPath,
    CudaVersion,
    DnsName,
    EnvName,
    EnvValue,
    GuestName,
    Hostname,
    MachineType,
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


class VenvService(Model):
    """A long-running server from a venv (a vLLM or SGLang server), as a systemd service."""

    name: DnsName = Field(
        description="Service name: the unit is gpuhost-<name>.service (a lowercase DNS label)."
    )
    command: list[ServiceArg] = Field(
        min_length=1,
        max_length=MAX_ITEMS,
        description="ExecStart= words; a first word without '/' is a program in the venv's bin/, "
        "e.g. ['vllm', 'serve', 'Qwen/Qwen3-8B', '--port=8000'].",
    )


class Venv(Model):
    """A uv virtual environment in a guest: its python, requirements and pins."""

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
        description="Constraints every install must honour (uv -c; UV_CONSTRAINT in the venv). "
        "'name==version' entries are pins: installed at exactly that version, and a package "
        "that would move one fails the run, naming both versions.",
    )
    imports: list[PyModule] | None = Field(
        None,
        max_length=MAX_ITEMS,
        description="Modules imported after each install to prove it; None: each pinned package's "
        "name with - and . as _.",
    )
    env: dict[EnvName, EnvValue] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="Environment of this venv (activation and its service), on top of the "
        "guest's; same grammar as the guest's env.",
    )
    service: VenvService | None = Field(
        None, description="A systemd service run from this venv with its environment."
    )


class GuestBase(Model):
    name: GuestName = Field(
        description="Guest name (container hostname / VM name): a DNS name, upper case allowed "
        "as Proxmox allows it."
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


class CudaRepo(Model):
    """An apt repository with NVIDIA's CUDA packages and the key that signs it."""

    url: AptUrl = Field(
        description="The flat repository (deb822 `Suites: /`): NVIDIA's network repository for "
        "the guest's distribution, .../compute/cuda/repos/<distro>/<arch>/ (debian12, debian13, "
        "ubuntu2204 or ubuntu2404, as the guest's os-release says; x86_64), or a mirror of it."
    )
    keyring: AbsPath = Field(
        description="Path, on the control machine, of the OpenPGP key that signs it (NVIDIA's "
        "<keyid>.pub, armored or binary); installed in the guest as the source's Signed-By."
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
    cuda_default: CudaVersion | None = Field(
        None,
        description="The toolkit /usr/local/cuda points to (update-alternatives --set cuda); "
        "None: the newest of cuda.",
    )
    cuda_repo: CudaRepo | None = Field(
        None,
        description="NVIDIA's CUDA apt repository (or a mirror of it); the guest deploy needs it "
        "to install cuda.",
    )
    python_index: list[IndexUrl] | None = Field(
        None,
        max_length=16,
        description="Package indexes uv uses in the guest, first = default; None: the control "
        "machine's own pip/uv index settings (http(s) ones); []: uv's default index.",
    )
    build_job_gib: int = Field(
        9,
        ge=1,
        le=256,
        description="Memory (GiB) one source-build job may take: MAX_JOBS = min(cores, memory "
        "/ this). 9 after flash-attn's setup.py ('each JOB peak memory cost is ~8-9GB').",
    )

    @model_validator(mode="after")
    def _software(self) -> LxcGuest:
        if self.cuda_default is not None and self.cuda_default not in self.cuda:
            raise ValueError(
                f"cuda_default {self.cuda_default!r} is not in cuda {self.cuda}; add it there"
            )
        if len(set(self.cuda)) != len(self.cuda):
            raise ValueError(f"cuda lists a version twice: {self.cuda}")
        paths = [v.path for v in self.venvs]
        names = [v.service.name for v in self.venvs if v.service]
        for what, items in (("venv path", paths), ("service name", names)):
            twice = sorted({x for x in items if items.count(x) > 1})
            if twice:
                raise ValueError(f"{what} {twice[0]!r} is used twice")
        return self

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
