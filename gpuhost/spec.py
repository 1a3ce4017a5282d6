"""The host spec: what an inventory says a Proxmox GPU host must be (pydantic v2).

Every field has a default or is required, and a description; README's inventory reference is
generated from these models (tests fail when it drifts). Validation is pure: no host is
contacted. Checks that need the live hardware (unknown BDF, IOMMU groups) live in the planner.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

BDF_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-1][0-9a-fA-F])\.(?P<fn>[0-7])$"
)
KERNEL_RE = re.compile(r"^\d+\.\d+\.\d+-\d+(?:-bpo\d+)?(?:-[a-z0-9]+)*-pve$")
DRIVER_RE = re.compile(r"^\d{3}\.\d{1,3}(?:\.\d{1,3})?$")
GCC_RE = re.compile(r"^\d+\.\d+\.\d+$")
CUDA_RE = re.compile(r"^\d+\.\d+$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Parameters gpuhost owns on the kernel command line; users set them through fields, not `extra`.
MANAGED_CMDLINE_KEYS = ("intel_iommu", "amd_iommu", "iommu", "pcie_acs_override", "pci")
# Minimum driver branch for each CUDA major.minor a guest may ask for (NVIDIA's compatibility
# table: CUDA 12.8 needs >= 570, CUDA 13.x needs >= 580).
CUDA_MIN_DRIVER = {"12.8": 570, "12.9": 575, "13.0": 580, "13.1": 580}


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def normalize_bdf(value: str) -> str:
    """'41:00.0' or '0000:41:00.0' -> '0000:41:00.0'; anything else is an error."""
    match = BDF_RE.match(value.strip())
    if not match:
        raise ValueError(
            f"{value!r} is not a PCI address; write domain:bus:device.function, e.g. '0000:41:00.0'"
        )
    domain = (match["domain"] or "0000").lower()
    return f"{domain}:{match['bus'].lower()}:{match['dev'].lower()}.{match['fn']}"


# --- kernel and toolchain -----------------------------------------------------------------------


class KernelBuild(Model):
    """A kernel built from the Proxmox kernel sources (pve-kernel)."""

    repo: str = Field(description="Git URL or local path of the pve-kernel sources.")
    ref: str = Field("bookworm-6.14", description="Branch, tag or commit to build.")
    config: dict[str, str] = Field(
        default_factory=dict,
        description="Kernel config fragment, CONFIG_* name -> y, m, n or a value.",
    )
    patches: list[str] = Field(
        default_factory=list, description="Extra patch files (paths under files/) applied in order."
    )

    @field_validator("config")
    @classmethod
    def _config_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not re.fullmatch(r"CONFIG_[A-Z0-9_]+", name):
                raise ValueError(
                    f"{name!r} is not a kernel config name; write e.g. 'CONFIG_VFIO_PCI'"
                )
        return value


class KernelSpec(Model):
    """The kernel the host must boot."""

    version: str = Field(
        description="Kernel release as `uname -r` prints it, e.g. '6.14.8-2-bpo12-pve'."
    )
    source: Literal["package", "build"] = Field(
        "package",
        description="'package': install proxmox-kernel-<version> from the host's apt sources; "
        "'build': build it from `build`.",
    )
    build: KernelBuild | None = Field(
        None, description="Source build recipe; required for source='build'."
    )
    keep: list[str] = Field(
        default_factory=list,
        description="Known-good kernels that must stay installed and bootable (the running "
        "kernel is always kept).",
    )

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not KERNEL_RE.match(value):
            raise ValueError(
                f"{value!r} is not a Proxmox kernel release; write it as `uname -r` prints it, "
                "e.g. '6.14.8-2-bpo12-pve' or '6.8.12-9-pve'"
            )
        return value

    @field_validator("keep")
    @classmethod
    def _keep(cls, value: list[str]) -> list[str]:
        return [cls._version(v) for v in value]

    @model_validator(mode="after")
    def _build_needs_recipe(self) -> KernelSpec:
        if self.source == "build" and self.build is None:
            raise ValueError("source='build' needs a `build` recipe (repo, ref, config)")
        if self.source == "package" and self.build is not None:
            raise ValueError("`build` is only used with source='build'; remove it or set source")
        return self


class ToolchainSpec(Model):
    """One compiler for the kernel and every out-of-tree module: a mismatch bricks the host."""

    gcc: str = Field(
        "12.2.0",
        description="GCC version (X.Y.Z) that must build the kernel and the NVIDIA modules.",
    )

    @field_validator("gcc")
    @classmethod
    def _gcc(cls, value: str) -> str:
        if not GCC_RE.match(value):
            raise ValueError(f"{value!r} is not a GCC version; write X.Y.Z, e.g. '12.2.0'")
        return value


# --- NVIDIA driver ------------------------------------------------------------------------------


class DriverSpec(Model):
    """The NVIDIA driver on the host; every GPU guest's userspace must match it exactly."""

    version: str = Field(description="Driver version, e.g. '595.71.05'.")
    open: bool = Field(
        True,
        description="Build the open kernel modules. Required for Blackwell and newer GPUs.",
    )

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not DRIVER_RE.match(value):
            raise ValueError(f"{value!r} is not an NVIDIA driver version; write e.g. '595.71.05'")
        return value

    @property
    def branch(self) -> int:
        return int(self.version.split(".")[0])


# --- boot parameters and modules -------------------------------------------------------------


class BootSpec(Model):
    """Kernel command line parameters gpuhost manages (GRUB or systemd-boot, detected)."""

    iommu: bool = Field(
        True, description="Turn the IOMMU on: intel_iommu=on on Intel, amd_iommu=on on AMD."
    )
    iommu_passthrough: bool | None = Field(
        None,
        description="iommu=pt: host devices get an identity (untranslated) IOMMU domain. None "
        "(auto) adds it unless a Blackwell GPU stays on the host driver: their FSP fails to boot "
        "(error 0x177) under an identity domain, so true is refused there.",
    )
    acs_override: Literal["downstream", "multifunction", "downstream,multifunction"] | None = Field(
        None,
        description="pcie_acs_override value, to split IOMMU groups a board lumps together "
        "(Proxmox kernel patch). None leaves it off.",
    )
    pci_realloc: bool = Field(
        False, description="Add pci=realloc (fixes BAR allocation for large-BAR GPUs)."
    )
    extra: list[str] = Field(
        default_factory=list,
        description="Other parameters to ensure, verbatim (e.g. 'pcie_aspm=off'). Other parameters "
        "on the host's command line are kept; one with the same name as an item here is replaced.",
    )

    @field_validator("extra")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        for param in value:
            if not param or any(c.isspace() for c in param) or '"' in param:
                raise ValueError(f"{param!r} is not one kernel parameter; give one word per item")
            key = param.split("=", 1)[0]
            if key in MANAGED_CMDLINE_KEYS:
                raise ValueError(
                    f"{param!r} is managed by gpuhost; use boot.iommu, boot.iommu_passthrough, "
                    "boot.acs_override or boot.pci_realloc instead"
                )
        return value


class ModulesSpec(Model):
    """Module options and boot-time module loading."""

    uvm_disable_hmm: bool = Field(
        True,
        description="options nvidia_uvm uvm_disable_hmm=1: CUDA fails to initialise in LXC "
        "containers without it.",
    )
    blacklist_nouveau: bool = Field(True, description="Blacklist nouveau so it never claims a GPU.")
    vfio_modules: list[str] = Field(
        default_factory=lambda: ["vfio", "vfio_iommu_type1", "vfio_pci"],
        description="Modules loaded at boot when any GPU goes to a VM.",
    )


# --- guests ---------------------------------------------------------------------------------------

GpuRef = Annotated[int | str, Field(description="A GPU by PCI address (BDF) or nvidia-smi index.")]


def _check_gpus(value: list[int | str] | Literal["rest"]) -> list[int | str] | Literal["rest"]:
    if value == "rest":
        return value
    if isinstance(value, str):
        raise ValueError(f"{value!r} is not a GPU list; give a list of BDFs/indexes or 'rest'")
    out: list[int | str] = []
    for ref in value:
        if isinstance(ref, int):
            if ref < 0:
                raise ValueError(f"GPU index {ref} is negative; nvidia-smi indexes start at 0")
            out.append(ref)
        else:
            out.append(normalize_bdf(ref))
    if len(set(out)) != len(out):
        raise ValueError(f"the same GPU is listed twice in {value}")
    return out


class Venv(Model):
    """A uv virtual environment in a guest (filled in by the CUDA/venv issue)."""

    path: str = Field(description="Absolute path of the venv in the guest.")
    python: str = Field("3.12", description="Python version uv installs for it.")
    cuda: str | None = Field(
        None, description="CUDA toolkit this venv builds against (sets CUDA_HOME)."
    )
    packages: list[str] = Field(default_factory=list, description="Requirements to install.")
    constraints: list[str] = Field(
        default_factory=list, description="Pins every install must honour, e.g. 'torch==2.9.1'."
    )


class GuestBase(Model):
    name: str = Field(description="Guest name (container hostname / VM name).")
    gpus: list[GpuRef] | Literal["rest"] = Field(
        default_factory=list,
        description="GPUs for this guest: BDFs ('0000:41:00.0'), nvidia-smi indexes, or 'rest' "
        "for every GPU no other guest names.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment for GPU workloads in the guest (e.g. NCCL_P2P_DISABLE).",
    )

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: object) -> object:
        if isinstance(value, list):
            return _check_gpus(value)  # type: ignore[arg-type]
        if value != "rest":
            raise ValueError(f"{value!r} is not a GPU list; give a list of BDFs/indexes or 'rest'")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not ENV_NAME_RE.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?", value):
            raise ValueError(f"{value!r} is not a valid hostname (letters, digits, '-')")
        return value


class LxcAccess(Model):
    """How pyinfra/testinfra reach the container itself."""

    ssh_hostname: str | None = Field(
        None, description="Address to SSH to; None: reach it through `pct exec` on the host."
    )
    ssh_user: str = Field("root", description="SSH user in the container.")
    ssh_port: int = Field(22, ge=1, le=65535, description="SSH port.")


class LxcGuest(GuestBase):
    """An LXC container that uses GPUs through the host's nvidia driver (bind-mounted nodes)."""

    kind: Literal["lxc"] = "lxc"
    ctid: int = Field(ge=100, le=999_999_999, description="Container id (pct).")
    access: LxcAccess = Field(default_factory=LxcAccess, description="How to reach the container.")
    devices: Literal["devN", "raw"] = Field(
        "devN",
        description="How GPU device nodes are granted: 'devN' (Proxmox resolves majors at "
        "start, PVE >= 8.1) or 'raw' (lxc.cgroup2 rules written from the live majors).",
    )
    cuda: list[str] = Field(
        default_factory=list,
        description="CUDA toolkits to install side by side, e.g. ['12.8', '13.0'].",
    )
    venvs: list[Venv] = Field(default_factory=list, description="uv venvs to create.")

    @field_validator("cuda")
    @classmethod
    def _cuda(cls, value: list[str]) -> list[str]:
        for version in value:
            if not CUDA_RE.match(version):
                raise ValueError(
                    f"{version!r} is not a CUDA version; write major.minor, e.g. '12.8'"
                )
            if version not in CUDA_MIN_DRIVER:
                known = ", ".join(CUDA_MIN_DRIVER)
                raise ValueError(
                    f"CUDA {version} is not supported by gpuhost; choose one of {known}"
                )
        return value

    @property
    def guest_id(self) -> int:
        return self.ctid


class VmGuest(GuestBase):
    """A QEMU VM that gets whole GPUs through vfio-pci passthrough (hostpciN)."""

    kind: Literal["vm"] = "vm"
    vmid: int = Field(ge=100, le=999_999_999, description="VM id (qm).")
    machine: str | None = Field(
        None,
        description="Machine type to set, e.g. 'q35' or 'pc-q35-8.1'. None keeps the VM's "
        "configured type, which must then already be q35 for GPU passthrough.",
    )

    @field_validator("machine")
    @classmethod
    def _q35(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and "q35" not in value and info.data.get("gpus"):
            raise ValueError(
                f"{value!r} is not q35; PCIe GPU passthrough (hostpci pcie=1) needs 'q35' "
                "(or 'pc-q35-<version>')"
            )
        return value

    @property
    def guest_id(self) -> int:
        return self.vmid


Guest = Annotated[LxcGuest | VmGuest, Field(discriminator="kind")]


class P2PSpec(Model):
    """Which GPU pairs must be able to do peer-to-peer DMA."""

    expected: Literal["auto", "none", "all"] = Field(
        "auto",
        description="'auto': derive from the link topology (NVLink or a shared PCIe switch/host "
        "bridge -> OK; across host bridges or sockets -> not supported); 'none' or 'all' to state it.",
    )
    unsafe_iommu: bool = Field(
        False,
        description="The IOMMU translates P2P DMA unsafely (e.g. SEV-SNP): expect no P2P and "
        "set NCCL_P2P_DISABLE=1 for GPU guests.",
    )


class HostSpec(Model):
    """A Proxmox VE host that carries NVIDIA GPUs."""

    kernel: KernelSpec = Field(description="The kernel to boot.")
    toolchain: ToolchainSpec = Field(default_factory=ToolchainSpec, description="The one compiler.")
    driver: DriverSpec = Field(description="The NVIDIA driver.")
    boot: BootSpec = Field(default_factory=BootSpec, description="Kernel command line.")
    modules: ModulesSpec = Field(default_factory=ModulesSpec, description="Module options.")
    guests: list[Guest] = Field(
        default_factory=list, description="Containers and VMs that get GPUs."
    )
    p2p: P2PSpec = Field(default_factory=P2PSpec, description="Expected P2P capability.")

    @model_validator(mode="after")
    def _guests(self) -> HostSpec:
        seen_ids: dict[int, str] = {}
        seen_names: set[str] = set()
        seen_gpus: dict[int | str, str] = {}
        rest = []
        for i, guest in enumerate(self.guests):
            where = f"guests[{i}]"
            if guest.guest_id in seen_ids:
                raise ValueError(
                    f"{where}: id {guest.guest_id} is already used by {seen_ids[guest.guest_id]}; "
                    "containers and VMs share one id space on a Proxmox node"
                )
            seen_ids[guest.guest_id] = where
            if guest.name in seen_names:
                raise ValueError(f"{where}: name {guest.name!r} is used twice")
            seen_names.add(guest.name)
            if guest.gpus == "rest":
                rest.append(where)
                continue
            for ref in guest.gpus:
                if ref in seen_gpus:
                    raise ValueError(
                        f"{where}: GPU {ref!r} is already given to {seen_gpus[ref]}; a GPU has one owner"
                    )
                seen_gpus[ref] = where
        if len(rest) > 1:
            raise ValueError(
                f"only one guest may take 'rest' of the GPUs, not {' and '.join(rest)}"
            )
        for i, guest in enumerate(self.guests):
            for cuda in getattr(guest, "cuda", []):
                needed = CUDA_MIN_DRIVER[cuda]
                if self.driver.branch < needed:
                    raise ValueError(
                        f"guests[{i}].cuda: CUDA {cuda} needs driver {needed} or newer, but "
                        f"driver.version is {self.driver.version}"
                    )
        return self

    @property
    def lxc_guests(self) -> list[LxcGuest]:
        return [g for g in self.guests if isinstance(g, LxcGuest)]

    @property
    def vm_guests(self) -> list[VmGuest]:
        return [g for g in self.guests if isinstance(g, VmGuest)]
