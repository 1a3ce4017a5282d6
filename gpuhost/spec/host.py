"""The host spec: what an inventory says a Proxmox GPU host must be (pydantic v2).

Every field has a default or is required, and a description; docs/reference/inventory.md is
generated from these models (tests fail when it drifts). Validation is pure: no host is
contacted. Checks that need the live hardware (unknown BDF, IOMMU groups) live in the planner.

Inventory values are untrusted text: every value type comes from gpuhost/spec/grammar.py (a strict
grammar, matched against the whole string), models are strict (``True`` is not a GPU index,
``"200"`` is not a ctid), and checks across fields (gpuhost/spec/checks.py) are reported with
the field errors, all at once.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gpuhost.spec.artifacts import ArtifactsSpec
from gpuhost.spec.build_values import (
    BaseConfig,
    ConfigName,
    ConfigValue,
    GitRef,
    GitRepo,
    LocalVersion,
    PatchPath,
)
from gpuhost.spec.checks import NO_VALUE, cross_field_problems
from gpuhost.spec.driver import DriverSource
from gpuhost.spec.guests import Guest, LxcGuest, VmGuest
from gpuhost.spec.monitoring import MonitoringSpec
from gpuhost.spec.proxmox import ProxmoxApiSpec
from gpuhost.spec.trial import TrialSpec
from gpuhost.spec.values import (
    MAX_ITEMS,
    AcsOverride,
    DriverVersion,
    GccVersion,
    GpuModel,
    KernelParam,
    KernelRelease,
    LinkClass,
    ModuleName,
)


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- kernel and toolchain -----------------------------------------------------------------------


class KernelBuild(Model):
    """A kernel built from source into .deb packages (`gpuhost build`), once, into the store."""

    repo: GitRepo = Field(
        description="The kernel source tree (a top-level Makefile with VERSION/PATCHLEVEL/"
        "SUBLEVEL), or a pve-kernel tree (its Makefile defines KVNAME; built through its own "
        "packaging into proxmox-kernel/proxmox-headers packages): an absolute path on the build machine, used as it is (an unpacked tarball or "
        "a checkout; `ref` is not applied to it), or a git URL (https://, ssh://, user@host:path) "
        "that `gpuhost build` clones at `ref` with its submodules; no credentials in the URL."
    )
    ref: GitRef = Field("bookworm-6.14", description="Branch or tag to clone from a git URL.")
    base_config: BaseConfig = Field(
        "defconfig",
        description="The config the fragment is applied to: 'tinyconfig', 'defconfig' or "
        "'allnoconfig' (make targets), or the absolute path of a config file on the build "
        "machine (e.g. the operator's 6.14 config). A pve-kernel tree: left out, the tree's own "
        "config; a file replaces it; make targets are refused.",
    )
    localversion: LocalVersion | None = Field(
        None,
        description="LOCALVERSION for make, e.g. '-2-bpo12-pve'. None: what follows X.Y.Z in "
        "kernel.version. `make -s kernelrelease` must equal kernel.version before anything is "
        "compiled. Not used for a pve-kernel tree: its KVNAME (KREL, KREL_EXTRA) is the release.",
    )
    config: dict[ConfigName, ConfigValue] = Field(
        default_factory=dict,
        max_length=MAX_ITEMS,
        description="Kernel config fragment, CONFIG_* name -> y, m, n, a number or plain text.",
    )
    patches: list[PatchPath] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Extra patch files applied in order, as normalised paths relative to files/ "
        "(e.g. 'patches/acs.patch'). Not applied yet: `gpuhost build` refuses a recipe with "
        "patches.",
    )

    def localversion_for(self, release: str) -> str:
        """LOCALVERSION: the field, or what follows X.Y.Z in the release."""
        return self.localversion or re.sub(r"^[0-9]+\.[0-9]+\.[0-9]+", "", release)


class KernelSpec(Model):
    """The kernel the host must boot."""

    version: KernelRelease = Field(
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
    keep: list[KernelRelease] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Known-good kernels that must stay installed and bootable (the running "
        "kernel is always kept).",
    )
    trial: TrialSpec = Field(
        default_factory=TrialSpec,
        description="How a new kernel is booted once before it is pinned.",
    )


class ToolchainSpec(Model):
    """One compiler for the kernel and every out-of-tree module: a mismatch bricks the host."""

    gcc: GccVersion = Field(
        "12.2.0",
        description="GCC version (X.Y.Z) that must build the kernel and the NVIDIA modules.",
    )


# --- NVIDIA driver ------------------------------------------------------------------------------


class DriverSpec(Model):
    """The NVIDIA driver on the host; every GPU guest's userspace must match it exactly."""

    version: DriverVersion = Field(description="Driver version, e.g. '595.71.05'.")
    open: bool = Field(
        True,
        description="Build the open kernel modules. Required for Blackwell and newer GPUs.",
    )
    source: DriverSource | None = Field(
        None, description="Where the driver's modules and userspace come from; None: not managed."
    )

    @model_validator(mode="after")
    def _open_source(self) -> DriverSpec:
        if self.source is not None and not self.open:
            raise ValueError("driver.source builds the open modules; set driver.open: true")
        return self

    @property
    def branch(self) -> int:
        return int(self.version.split(".")[0])


# --- boot parameters and modules -------------------------------------------------------------


class BootSpec(Model):
    """Kernel command line parameters gpuhost manages (GRUB or systemd-boot, detected)."""

    iommu: bool = Field(
        True,
        description="The IOMMU must be on. Intel: writes intel_iommu=on. AMD: the IOMMU is on by "
        "default and amd_iommu=on is not a valid kernel option, so nothing is written. A value on "
        "the host's command line that turns the IOMMU off (intel_iommu=off, amd_iommu=off) is "
        "refused; any other value the host has is kept.",
    )
    iommu_passthrough: bool | None = Field(
        None,
        description="iommu=pt: host-driver devices get identity (untranslated) IOMMU domains. None "
        "(auto) adds it unless SEV-SNP is active and boot.snp is 'keep' (the two exclude each "
        "other: iommu=pt turns SNP off at boot). true on such a host needs boot.snp 'give_up'.",
    )
    snp: Literal["keep", "give_up"] = Field(
        "keep",
        description="On a host where SEV-SNP is active: 'keep' keeps SNP, so no identity IOMMU "
        "domains (no iommu=pt); P2P through the translating IOMMU is not relied on and GPU "
        "guests get NCCL_P2P_DISABLE=1. 'give_up' allows iommu=pt, which turns SNP off at boot "
        "('SNP: IOMMU disabled or configured in passthrough mode'): SEV-SNP guests can no longer "
        "run. Ignored where SNP is not active.",
    )
    acs_override: AcsOverride | None = Field(
        None,
        description="pcie_acs_override value, to split IOMMU groups a board lumps together "
        "(Proxmox kernel patch): a comma-separated list of 'downstream', 'multifunction' and "
        "'id:vvvv:dddd' (vendor:device in hex, up to 16). None leaves it off.",
    )
    pci_realloc: bool = Field(
        False, description="Add pci=realloc (fixes BAR allocation for large-BAR GPUs)."
    )
    extra: list[KernelParam] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="Other parameters to ensure, one name[=value] per item (e.g. 'pcie_aspm=off'; "
        "printable ASCII, no spaces, quotes, $, backticks, backslashes, ; & | < > ( ) or #). "
        "Parameters gpuhost manages (intel_iommu, amd_iommu, iommu, iommu.passthrough, "
        "iommu.strict, pcie_acs_override, pci) are refused here: use their fields. Other "
        "parameters in the boot loader's configuration are kept; one of yours with the same name "
        "and another value is refused (gpuhost never overrides what it did not write).",
    )


class ModulesSpec(Model):
    """Module options and boot-time module loading."""

    uvm_disable_hmm: bool = Field(
        True,
        description="options nvidia_uvm uvm_disable_hmm=1: CUDA fails to initialise in LXC "
        "containers without it.",
    )
    blacklist_nouveau: bool = Field(True, description="Blacklist nouveau so it never claims a GPU.")
    vfio_modules: list[ModuleName] = Field(
        default_factory=lambda: ["vfio", "vfio_iommu_type1", "vfio_pci"],
        max_length=64,
        description="Modules loaded at boot when any GPU goes to a VM ([a-z0-9_]+).",
    )


class P2PSpec(Model):
    """Which GPU pairs must be able to do peer-to-peer DMA."""

    expected: Literal["auto", "none", "all"] = Field(
        "auto",
        description="'auto': what the driver itself answers (`nvidia-smi topo -p2p r` and `w`: "
        "OK), downgraded to none where IOMMU translation or SEV-SNP makes P2P unsafe; 'none' or "
        "'all' to state it.",
    )
    unsafe_iommu: bool = Field(
        False,
        description="Manual override: the IOMMU translates P2P DMA unsafely on this host: expect "
        "no P2P and set NCCL_P2P_DISABLE=1 for GPU guests (automatic where SEV-SNP is active and "
        "boot.snp is 'keep').",
    )
    link: LinkClass | None = Field(
        None,
        description="The `nvidia-smi topo -m` link class expected between every two GPUs that "
        "share an owner, e.g. 'NV18' on an NVLink pair; the audit checks it. None: not checked.",
    )


class ReadinessSpec(Model):
    """The readiness check each GPU guest runs at its start (Proxmox hookscript)."""

    enabled: bool = Field(
        True,
        description="Give every GPU guest gpuhost's hookscript, which holds its start back until "
        "its GPUs are ready (device nodes, driver, firmware, vfio-pci); false removes it and "
        "gives each guest its own hookscript back.",
    )
    wait: int = Field(
        60,
        ge=0,
        le=600,
        description="Seconds a start waits for the boot unit that makes the device nodes before "
        "it is refused.",
    )


class HardwareSpec(Model):
    """What the host must carry; the audit fails when the host shows something else."""

    gpus: int = Field(ge=1, le=64, description="Number of NVIDIA GPUs on the PCI bus.")
    gpu_model: GpuModel | None = Field(
        None, description="Model of every GPU as nvidia-smi names it, e.g. 'NVIDIA H200'."
    )


class HostSpec(Model):
    """A Proxmox VE host that carries NVIDIA GPUs."""

    kernel: KernelSpec = Field(description="The kernel to boot.")
    toolchain: ToolchainSpec = Field(default_factory=ToolchainSpec, description="The one compiler.")
    driver: DriverSpec = Field(description="The NVIDIA driver.")
    boot: BootSpec = Field(default_factory=BootSpec, description="Kernel command line.")
    modules: ModulesSpec = Field(default_factory=ModulesSpec, description="Module options.")
    guests: list[Guest] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="Containers and VMs that get GPUs."
    )
    p2p: P2PSpec = Field(default_factory=P2PSpec, description="Expected P2P capability.")
    readiness: ReadinessSpec = Field(
        default_factory=ReadinessSpec, description="The GPU guests' readiness check at start."
    )
    hardware: HardwareSpec | None = Field(
        None, description="GPUs the host must carry (audited); None: whatever the host shows."
    )
    artifacts: ArtifactsSpec = Field(
        default_factory=ArtifactsSpec, description="Where built kernels and modules are kept."
    )
    proxmox: ProxmoxApiSpec = Field(
        default_factory=ProxmoxApiSpec,
        description="The host's Proxmox API, used for VMs' PCI mappings, hostpci entries and "
        "power tasks, and to list guests for the inventory.",
    )
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec,
        description="The audit as Prometheus metrics on the host (a timer, node_exporter).",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _every_problem(cls, data: Any, handler: Any) -> HostSpec:
        cross = [
            {
                "type": PydanticCustomError(
                    "cross_field" if value is NO_VALUE else "cross_value", msg
                ),
                "loc": loc,
                "input": None if value is NO_VALUE else value,
            }
            for loc, msg, value in cross_field_problems(data)
        ]
        try:
            spec = handler(data)
        except ValidationError as exc:
            if not cross:
                raise
            field_errors = [
                {
                    "type": PydanticCustomError(e["type"], e["msg"]),
                    "loc": e["loc"],
                    "input": e["input"],
                }
                for e in exc.errors(include_url=False)
            ]
            raise ValidationError.from_exception_data(
                cls.__name__, [*field_errors, *cross]
            ) from None
        if cross:
            raise ValidationError.from_exception_data(cls.__name__, cross)
        return spec

    def to_json(self) -> dict[str, Any]:
        """For pyinfra's JSON output (`pyinfra INVENTORY debug-inventory`)."""
        return self.model_dump(mode="json")

    @property
    def lxc_guests(self) -> list[LxcGuest]:
        return [g for g in self.guests if isinstance(g, LxcGuest)]

    @property
    def vm_guests(self) -> list[VmGuest]:
        return [g for g in self.guests if isinstance(g, VmGuest)]
