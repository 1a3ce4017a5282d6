"""Hardware profiles of simulated hosts: what the twin's "machine" is made of.

A profile is YAML in twin/profiles/<name>.yaml, validated here. It describes only hardware and
firmware facts (PCI tree, GPUs, link matrix, quirks, factory-installed kernels and boot config);
everything a deploy changes later lives in the twin's root, never in the profile.

    profile = load_profile("kpro6")            # or load_profile(Path("my.yaml"))
    profile.model_dump_json()                  # what hardware.install() writes for the shims

Errors name the field, the value and the fix, e.g.
    kpro6.yaml: gpus[2].bdf='0000:42:00.0' is not in pci_devices; add the device or fix the BDF
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from twin.profile_boot import Boot
from twin.profile_start import HostStart

# libyaml's loader where PyYAML has it: the same documents, about 7 times faster than the pure
# Python one; and each text is parsed once per process (tests load a profile for every temp-dir
# twin: seconds of a run). The cache keeps the data pickled: every load gets its own copy.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_parsed: dict[str, bytes] = {}


def _yaml_data(text: str) -> object:
    if text not in _parsed:
        _parsed[text] = pickle.dumps(yaml.load(text, Loader=_Loader))
    return pickle.loads(_parsed[text])


PROFILES_DIR = Path(__file__).parent / "profiles"

BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
HEX4_RE = re.compile(r"^[0-9a-f]{4}$")
# Link and P2P vocabularies of `nvidia-smi topo -m` / `topo -p2p` (docs/reference/formats.md §8, captures).
LINKS = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV\d+)$")
P2P_STATES = {"X", "OK", "CNS", "GNS", "TNS", "NS", "U"}
P2P_MODES = ("r", "w", "n", "a", "p")


class ProfileError(ValueError):
    """A profile that cannot describe a machine; the message names field, value and fix."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


Hex4 = Annotated[str, Field(pattern=HEX4_RE.pattern)]


class Cpu(_Model):
    vendor: Literal["AMD", "Intel"]
    model_name: str
    cpus: int = Field(gt=0, description="logical CPUs")
    sockets: int = Field(1, gt=0)
    numa_nodes: int = Field(1, gt=0)
    hypervisor: str | None = None  # lscpu "Hypervisor vendor" (the H200 capture ran under KVM)

    @property
    def vendor_id(self) -> str:
        return "AuthenticAMD" if self.vendor == "AMD" else "GenuineIntel"


class PciDevice(_Model):
    bdf: str
    vendor: Hex4
    device: Hex4
    class_code: str = Field(alias="class", pattern=r"^[0-9a-f]{6}$")
    subsystem_vendor: Hex4 = "0000"
    subsystem_device: Hex4 = "0000"
    revision: str = Field("00", pattern=r"^[0-9a-f]{2}$")
    numa_node: int = -1
    parent: str | None = None  # upstream bridge / root port BDF; None = on a host bridge's bus
    iommu_group: int | None = None  # None: not behind an IOMMU (e.g. a VM without vIOMMU)
    # Group with pcie_acs_override=downstream,multifunction; None = same as iommu_group.
    acs_override_group: int | None = None
    acs: bool = False  # port has an ACS capability (lspci -vv ACSCap/ACSCtl)
    driver: str | None = None  # in-kernel driver bound at boot (non-GPU devices: nvme, pcieport...)
    modules: list[str] = []  # lspci -k "Kernel modules:" candidates besides nvidia*
    irq: int = 0
    # Function reset methods the kernel found (sysfs reset_method: flr, pm, bus, ...); empty:
    # the function cannot be reset on its own, and sysfs has no reset/reset_method for it.
    reset_methods: list[str] = []
    # Shown when the root has no pci.ids (Debian 12's 2023 pci.ids knows no H200/RTX PRO 6000).
    name: str | None = None

    @field_validator("bdf", "parent")
    @classmethod
    def _bdf(cls, value: str | None) -> str | None:
        if value is not None and not BDF_RE.match(value):
            raise ValueError(f"{value!r} is not a PCI address; write it like '0000:41:00.0'")
        return value

    @property
    def is_bridge(self) -> bool:
        return self.class_code.startswith("0604")


class Gpu(_Model):
    bdf: str
    name: str  # nvidia-smi's product name, e.g. "NVIDIA H200"
    architecture: str  # -q "Product Architecture"
    memory_mib: int = Field(gt=0)
    uuid: str | None = None  # exact GPU UUID, else derived from uuid_seed
    uuid_seed: str | None = None
    vbios: str = Field(pattern=r"^[0-9A-F]{2}(\.[0-9A-F]{2}){4}$")
    compute_cap: str = Field(pattern=r"^\d+\.\d+$")
    serial: str = "N/A"
    pdi: str = "N/A"
    board_id: str = "0x0"
    module_id: str = "N/A"
    board_part_number: str = "N/A"
    gpu_part_number: str = "N/A"
    persistence_mode: bool = False
    ecc: bool = True
    mig: bool | None = None  # None: not MIG capable ("N/A")
    fan: str = "N/A"
    temperature_c: int = 35
    power_draw_w: int = 100
    power_limit_w: int = 600
    cpu_affinity: str
    numa_affinity: str
    gpu_numa_id: str = "N/A"
    irq: int = 0
    dma_bits: int = 52
    # Blackwell FSP cannot boot when the GPU's IOMMU domain is identity (error 0x177) on a host
    # whose firmware has SEV-SNP on (quirks.sev_snp); without SNP, identity domains work.
    fsp_fails_on_identity: bool = False

    @field_validator("bdf")
    @classmethod
    def _bdf(cls, value: str) -> str:
        if not BDF_RE.match(value):
            raise ValueError(f"{value!r} is not a PCI address; write it like '0000:41:00.0'")
        return value

    @model_validator(mode="after")
    def _uuid(self) -> Gpu:
        if (self.uuid is None) == (self.uuid_seed is None):
            raise ValueError("give exactly one of uuid or uuid_seed")
        if self.uuid is not None and not re.match(
            r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", self.uuid
        ):
            raise ValueError(f"uuid={self.uuid!r} is not like 'GPU-904a02bd-6d34-0f67-bb40-...'")
        return self


class Topology(_Model):
    """`nvidia-smi topo` matrices, row/column order = gpus order; diagonal 'X'."""

    links: list[list[str]]
    p2p: dict[str, list[list[str]]]


class Kernel(_Model):
    version: str = Field(pattern=r"^\d+\.\d+\.\d+-\S+$")
    gcc: str  # CONFIG_CC_VERSION_TEXT, e.g. "gcc (Debian 12.2.0-14) 12.2.0"
    ld: str = "GNU ld (GNU Binutils for Debian) 2.40"
    builder: str = "build@proxmox"
    build: str | None = None  # /proc/version tail; default "#1 SMP PREEMPT_DYNAMIC PMX <ver> (...)"
    # What Proxmox's packaging adds to a kernel (hwsim/storage.py): zfs.ko and spl.ko in
    # /lib/modules/<ver>/zfs/, and the pcie_acs_override patch (a symbol in System.map).
    zfs: bool = True
    acs_override: bool = True
    # False: no /lib/modules/<version> (drivers built in or loaded from outside, as on the H200
    # captures' microVM): modprobe(8) finds none of the kernel's in-tree modules (nouveau, vfio...)
    in_tree_modules: bool = True

    @field_validator("gcc")
    @classmethod
    def _gcc(cls, value: str) -> str:
        if not re.search(r"\b\d+\.\d+\.\d+\s*$", value):
            raise ValueError(
                f"{value!r} does not end in a GCC release; write it as /proc/version shows it,"
                " e.g. 'gcc (Debian 12.2.0-14) 12.2.0'"
            )
        return value


class Quirks(_Model):
    # SEV-SNP forces a translating IOMMU: P2P DMA between GPUs silently corrupts data.
    sev_snp: bool = False
    # Intel: the kernel's CONFIG_INTEL_IOMMU_DEFAULT_ON (IOMMU on without intel_iommu=on).
    intel_iommu_default_on: bool = False
    # The firmware refuses EFI variable writes from the OS (a Dell BIOS setting): writes seem to
    # succeed but nothing sticks.
    efivars_readonly: bool = False


class Nvidia(_Model):
    """Driver-facing constants of this machine that the captures fix (not the driver version)."""

    build_tag: str = "(root@localhost)  "  # NVRM version line tail after "Release Build  "
    fixed_majors: dict[str, int] = {
        "nvidia-nvswitch": 239,
        "nvidia-nvlink": 240,
        "nvidia-caps-imex-channels": 242,
    }
    # Majors of the first boot, to reproduce a capture; later boots pick new dynamic ones.
    first_boot_majors: dict[str, int] = {}
    nvlink_links: int = 0  # NVLinks per GPU (nvidia-smi nvlink -s)
    nvlink_gbps: str = "26.562"


class ZfsPool(_Model):
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_.:-]*$")
    state: Literal["ONLINE", "DEGRADED", "FAULTED", "OFFLINE", "UNAVAIL", "SUSPENDED"] = "ONLINE"


class Profile(_Model):
    name: str
    description: str = ""
    hostname: str
    # The Proxmox VE release the host runs; it picks the Debian userland the twin stands on
    # (debian_suite: 8 bookworm, 9 trixie) and what the simulated Proxmox tools follow.
    pve: Literal[8, 9] = 8
    cpu: Cpu
    memory_gib: int = Field(gt=0)
    boot: Boot
    pci_devices: list[PciDevice]
    gpus: list[Gpu]
    topology: Topology
    kernels: list[Kernel] = Field(min_length=1)
    failing_kernels: list[str] = []  # versions that panic at boot (panic=N reboots, else it hangs)
    quirks: Quirks = Quirks()
    nvidia: Nvidia = Nvidia()
    # /proc/devices lines that exist without the NVIDIA driver ("<major> <name>").
    char_devices: list[str] | None = None
    block_devices: list[str] | None = None
    dmesg: list[str] = []  # platform lines of the boot log before any driver (iommu: ...)
    zfs_pools: list[ZfsPool] | None = None  # None: rpool on a ZFS root, else none
    # A profile made from a capture (twin/profile_start.py): the host's software as read, what
    # the profile assumed where the capture could not know, and which capture it came from.
    start: HostStart | None = None
    assumed: list[str] = []
    source: str | None = None

    @model_validator(mode="after")
    def _cross_checks(self) -> Profile:
        bdfs = [d.bdf for d in self.pci_devices]
        dupes = sorted({b for b in bdfs if bdfs.count(b) > 1})
        if dupes:
            raise ValueError(f"pci_devices lists {dupes} twice; each BDF once")
        known = set(bdfs)
        for i, dev in enumerate(self.pci_devices):
            if dev.parent is not None and dev.parent not in known:
                raise ValueError(
                    f"pci_devices[{i}].parent={dev.parent!r} is not in pci_devices;"
                    " add the bridge/root port or fix the parent BDF"
                )
        by_bdf = {d.bdf: d for d in self.pci_devices}
        for i, gpu in enumerate(self.gpus):
            dev = by_bdf.get(gpu.bdf)
            if dev is None:
                raise ValueError(
                    f"gpus[{i}].bdf={gpu.bdf!r} is not in pci_devices; add the device or fix the BDF"
                )
            if dev.vendor != "10de" or not dev.class_code.startswith("03"):
                raise ValueError(
                    f"gpus[{i}].bdf={gpu.bdf!r} is {dev.vendor}:{dev.device} class {dev.class_code};"
                    " a GPU must be vendor 10de with a display class (03xxxx)"
                )
        self._check_matrices()
        versions = [k.version for k in self.kernels]
        self._check_direct_boot(versions)
        if len(set(versions)) != len(versions):
            raise ValueError(f"kernels lists a version twice: {versions}")
        if set(versions) <= set(self.failing_kernels):
            raise ValueError(
                f"failing_kernels={self.failing_kernels} covers every installed kernel;"
                " the machine could never boot: keep one known-good kernel"
            )
        return self

    def _check_direct_boot(self, versions: list[str]) -> None:
        """loader none: the hypervisor's kernel is one of kernels, and what a captured start
        ran is what the hypervisor passes at every boot (profile_boot.py)."""
        boot = self.boot
        if boot.loader != "none":
            return
        if boot.kernel not in versions:
            raise ValueError(
                f"boot.kernel={boot.kernel!r} is not in kernels {versions}; add it or fix the"
                " release the hypervisor boots"
            )
        start = self.start
        if start is not None and start.running_kernel not in (None, boot.kernel):
            raise ValueError(
                f"start.running_kernel={start.running_kernel!r} differs from boot.kernel="
                f"{boot.kernel!r}: a machine without a loader boots the hypervisor's kernel"
            )
        if start is not None and start.cmdline not in (None, boot.kernel_cmdline):
            raise ValueError(
                f"start.cmdline differs from boot.kernel_cmdline={boot.kernel_cmdline!r}: the"
                " hypervisor passes the same command line at every boot; make them equal"
            )

    def _check_matrices(self) -> None:
        n = len(self.gpus)
        matrices = {"topology.links": self.topology.links}
        for mode in P2P_MODES:
            if mode not in self.topology.p2p:
                raise ValueError(f"topology.p2p lacks mode {mode!r}; give all of {P2P_MODES}")
            matrices[f"topology.p2p.{mode}"] = self.topology.p2p[mode]
        extra = set(self.topology.p2p) - set(P2P_MODES)
        if extra:
            raise ValueError(f"topology.p2p has unknown modes {sorted(extra)}; use {P2P_MODES}")
        for where, matrix in matrices.items():
            if len(matrix) != n or any(len(row) != n for row in matrix):
                raise ValueError(f"{where} must be {n}x{n} (one row and column per GPU)")
            for r, row in enumerate(matrix):
                for c, cell in enumerate(row):
                    ok = LINKS.match(cell) if where == "topology.links" else cell in P2P_STATES
                    if not ok or (cell == "X") != (r == c):
                        raise ValueError(
                            f"{where}[{r}][{c}]={cell!r} is invalid; 'X' on the diagonal only,"
                            " links SYS/NODE/PHB/PXB/PIX/NV#, p2p OK/CNS/GNS/TNS/NS/U"
                        )
                    if matrix[c][r] != cell:
                        raise ValueError(f"{where} is not symmetric at [{r}][{c}]/[{c}][{r}]")

    @property
    def debian_suite(self) -> str:
        """The Debian release this Proxmox VE release is built on (rootfs.SUITES has both)."""
        return {8: "bookworm", 9: "trixie"}[self.pve]

    def kernel(self, version: str) -> Kernel | None:
        return next((k for k in self.kernels if k.version == version), None)


def _format_errors(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ""
        for part in err["loc"]:
            loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
        value = err.get("input")
        shown = "" if isinstance(value, dict | list) or value is None else f"={value!r}"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field; remove it or fix its spelling"
        elif err["type"] == "missing":
            msg = "required field is missing; add it"
        lines.append(f"{source}: {loc}{shown}: {msg}" if loc else f"{source}: {msg}")
    return "\n".join(lines)


def parse_profile(data: object, source: str = "profile") -> Profile:
    """Validate already-loaded profile data; raise ProfileError naming field, value and fix."""
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile is a mapping of fields, got {type(data).__name__}")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_format_errors(source, exc)) from None


def load_profile(name_or_path: str | Path) -> Profile:
    """Load twin/profiles/<name>.yaml (or a YAML path) as a validated Profile."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = PROFILES_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))
        raise ProfileError(f"profile {str(name_or_path)!r} not found; known profiles: {known}")
    try:
        data = _yaml_data(path.read_text())
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path.name}: not valid YAML: {exc}") from None
    return parse_profile(data, path.name)
