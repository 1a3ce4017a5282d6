"""The planner: spec + facts -> Plan. Pure: no I/O, no host contact.

The Plan is the one description of the desired state: which GPU goes to whom and which driver
binds it, every managed file's path and content (or absence), the kernel command line, module
options, the follow-up steps those files need, expected P2P, and every reason to reboot. Deploys
apply it, `gpuhost plan` and `--dry` render it, the audit checks it. Splits that cannot work are
refused with every problem named.

Reasons to reboot are read from what the host shows (the running command line, live module
parameters), never from what a run changed: a run killed anywhere converges on the next.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuhost import bootconf, modconf
from gpuhost.gpus import model_name, needs_open_modules
from gpuhost.hostfacts import HostFacts
from gpuhost.spec import HostSpec
from gpuhost.split import (
    HOST,
    Owner,
    assign,
    check_iommu_groups,
    check_vms,
    owner_of_guest,
    slot,
)

__all__ = ["HOST", "Owner", "Plan", "PlanError", "make_plan", "plan_cmdline"]

# Link types of `nvidia-smi topo -m` across which the driver allows P2P: NVLink, or PCIe that
# stays under one switch or host bridge. NODE and SYS cross host bridges / sockets.
P2P_LINKS = ("PIX", "PXB", "PHB")
STATE_DIR = "/var/lib/gpuhost"  # gpuhost's own records on the host (pending steps, last reboot)
# Concerns whose reboot this deploy makes; the others wait for the deploys that will own them.
REBOOT_NOW = ("cmdline", "modules")


class PlanError(ValueError):
    """The spec cannot be applied to this host; every problem is listed."""

    def __init__(self, host: str, problems: list[str], source: str | None = None) -> None:
        self.host, self.problems, self.source = host, problems, source
        where = f"{source}: " if source else ""
        lines = [f"{where}host {host!r}: the plan is refused ({len(problems)} problem(s))"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class GpuAssignment:
    index: int  # PCI bus order = nvidia-smi index while every GPU is on the nvidia driver
    bdf: str
    model: str
    numa_node: int | None
    iommu_group: int | None
    driver_now: str | None
    driver_planned: str  # "nvidia" | "vfio-pci"
    owner: Owner
    functions: tuple[str, ...] = ()  # other functions of the board (audio...) that go with it


@dataclass(frozen=True)
class Reason:
    """Why a reboot will be needed, tagged with the concern that resolves it."""

    concern: str  # "cmdline" | "modules" | "kernel" | "driver" | "binding"
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class ManagedFile:
    """A file the host must hold exactly (or not hold: ``content`` None), or a symlink."""

    path: str
    content: str | None
    concern: str  # "cmdline" | "modules" | "devices"
    mode: str = "644"
    link: str | None = None  # a symlink to this target instead of content

    @property
    def present(self) -> bool:
        return self.content is not None or self.link is not None


@dataclass(frozen=True)
class FollowUp:
    """A step that must run after some managed files change, until it has succeeded once.

    A run records it as pending on the host (``marker``) before it writes any trigger file and
    clears it when the step succeeds, so a run killed in between still runs it next time.
    """

    name: str
    command: str
    triggers: tuple[str, ...]  # managed file paths

    @property
    def marker(self) -> str:
        return f"{STATE_DIR}/pending-{self.name}"


@dataclass
class Plan:
    host: str
    gpus: list[GpuAssignment]
    loader: str  # "systemd-boot" | "grub"
    iommu_passthrough: bool  # iommu=pt planned
    cmdline_owned: list[str]  # the parameters gpuhost adds to the boot loader's command line
    cmdline_present: list[str]  # must be on /proc/cmdline after the next boot
    cmdline_absent: list[str]  # must not be (gpuhost added them once; no longer wanted)
    cmdline: list[str]  # the expected /proc/cmdline after the next boot
    running_cmdline: list[str]
    files: dict[str, ManagedFile]
    follow_ups: list[FollowUp]
    module_options: dict[str, dict[str, str]]  # modprobe.d: module -> option -> value
    blacklist: list[str]
    modules_load: dict[str, list[str]]  # modules-load.d drop-in ("nvidia", "vfio") -> modules
    expected_parameters: dict[str, dict[str, str]]  # /sys/module/<m>/parameters after boot
    p2p: dict[tuple[str, str], bool | None]  # (bdf, bdf) -> P2P expected; None: not checked
    guest_env: dict[Owner, dict[str, str]]
    running_kernel: str
    next_boot_kernel: str | None  # what a reboot would start now (None: unknown)
    pin_running_kernel: bool = False  # pin it before rebooting: something else would boot
    reboot_reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def cmdline_add(self) -> list[str]:
        """Planned parameters the running command line lacks."""
        return [p for p in self.cmdline_present if p not in self.running_cmdline]

    @property
    def cmdline_remove(self) -> list[str]:
        """Parameters on the running command line that must go."""
        return [p for p in self.cmdline_absent if p in self.running_cmdline]

    @property
    def reboot_now(self) -> list[Reason]:
        """The reasons this deploy reboots for."""
        return [r for r in self.reboot_reasons if r.concern in REBOOT_NOW]

    @property
    def reboot_later(self) -> list[Reason]:
        """Reasons that need a later deploy (kernel, driver, GPU binding) first."""
        return [r for r in self.reboot_reasons if r.concern not in REBOOT_NOW]

    @property
    def needs_reboot(self) -> bool:
        return bool(self.reboot_reasons)

    def owner_of(self, bdf: str) -> Owner:
        return next(g.owner for g in self.gpus if g.bdf == bdf)


def plan_cmdline(spec: HostSpec, cpu_vendor: str, passthrough: bool) -> list[str]:
    """The kernel parameters gpuhost wants on the command line, in order."""
    boot = spec.boot
    wanted: list[str] = []
    if boot.iommu:
        wanted.append("intel_iommu=on" if cpu_vendor == "intel" else "amd_iommu=on")
    if passthrough:
        wanted.append("iommu=pt")
    if boot.acs_override:
        wanted.append(f"pcie_acs_override={boot.acs_override}")
    if boot.pci_realloc:
        wanted.append("pci=realloc")
    return wanted + list(boot.extra)


def plan_passthrough(spec: HostSpec, host_blackwell: list[str], problems: list[str]) -> bool:
    """iommu=pt unless a Blackwell GPU stays on the host driver (identity domain: FSP 0x177)."""
    wanted = spec.boot.iommu_passthrough
    if wanted and host_blackwell:
        problems.append(
            f"boot.iommu_passthrough is true but {', '.join(host_blackwell)} are Blackwell GPUs "
            "that stay on the host driver: under an identity IOMMU domain (iommu=pt) their FSP "
            "fails to boot (error 0x177); leave boot.iommu_passthrough unset or false"
        )
    return bool(spec.boot.iommu) and (wanted if wanted is not None else not host_blackwell)


def _boot_config(
    spec: HostSpec, facts: HostFacts, loader: str, wanted: list[str]
) -> bootconf.BootConfig:
    files = facts.files
    if files is None:  # a snapshot taken without the boot loader's files: judge by /proc/cmdline
        base = [p for p in facts.cmdline if not p.startswith(("BOOT_IMAGE=", "initrd="))]
        files = {bootconf.KERNEL_CMDLINE: " ".join(base) + "\n"} if loader == "systemd-boot" else {}
    if loader == "systemd-boot":
        return bootconf.systemd_boot(files, wanted)
    return bootconf.grub(files, bootconf.grub_user_params(files), wanted)


def _expected_p2p(
    spec: HostSpec, facts: HostFacts, assignments: list[GpuAssignment], notes: list[str]
) -> dict[tuple[str, str], bool | None]:
    on_host = [a for a in assignments if a.driver_planned == "nvidia"]
    pairs = [(a, b) for a in on_host for b in on_host if a.bdf < b.bdf and a.owner == b.owner]
    if not pairs:
        return {}
    if spec.p2p.unsafe_iommu:
        notes.append(
            "P2P: unsafe under this IOMMU; guests get NCCL_P2P_DISABLE=1 and P2P is not relied on"
        )
        return {(a.bdf, b.bdf): None for a, b in pairs}
    if spec.p2p.expected != "auto":
        return {(a.bdf, b.bdf): spec.p2p.expected == "all" for a, b in pairs}
    topo = facts.topology
    names = {g.bdf: f"GPU{g.index}" for g in facts.gpus.gpus}
    if topo is None or not all(a.bdf in names and b.bdf in names for a, b in pairs):
        notes.append(
            "P2P: topology unknown until the nvidia driver runs every GPU; re-plan after boot"
        )
        return {(a.bdf, b.bdf): None for a, b in pairs}
    result = {}
    for a, b in pairs:
        link = topo.links[(names[a.bdf], names[b.bdf])]
        result[(a.bdf, b.bdf)] = link.startswith("NV") or link in P2P_LINKS
    return result


def _version_key(release: str) -> tuple[int, ...]:
    """Order kernel releases as proxmox-boot-tool does (version sort on the numbers)."""
    import re

    return tuple(int(n) for n in re.findall(r"\d+", release))


def next_boot_kernel(facts: HostFacts) -> str | None:
    """The kernel a reboot starts now: the next-boot pin, the pin, else the newest installed."""
    kernels = facts.boot_kernels
    if kernels is None:
        return None
    if kernels.next_boot or kernels.pinned:
        return kernels.next_boot or kernels.pinned
    return max(kernels.all, key=_version_key, default=None)


def _files(plan_parts: dict[str, tuple[str | None, str]]) -> dict[str, ManagedFile]:
    return {
        path: ManagedFile(path=path, content=content, concern=concern)
        for path, (content, concern) in plan_parts.items()
    }


def make_plan(host: str, spec: HostSpec, facts: HostFacts, source: str | None = None) -> Plan:
    problems: list[str] = []
    notes: list[str] = []
    gpus = sorted((d for d in facts.pci.values() if d.is_gpu), key=lambda d: d.bdf)
    wanted = sum(len(g.gpus) for g in spec.guests if g.gpus != "rest")
    if wanted > len(gpus):
        problems.append(f"the guests ask for {wanted} GPUs but this host has {len(gpus)}")
    owners = assign(spec, gpus, problems)
    notes += check_iommu_groups(spec, facts, owners, gpus, problems)
    notes += check_vms(spec, facts, owners, problems)
    if not spec.driver.open:
        blackwell = [g.bdf for g in gpus if needs_open_modules(g.device)]
        if blackwell:
            problems.append(
                f"driver.open is false but {', '.join(blackwell)} are Blackwell GPUs, which only "
                "the open kernel modules support; set driver.open: true"
            )
    host_blackwell = [
        g.bdf for g in gpus if needs_open_modules(g.device) and owners.get(g.bdf, HOST).kind != "vm"
    ]
    passthrough = plan_passthrough(spec, host_blackwell, problems)
    kernel = facts.kernel
    if kernel.release == spec.kernel.version and kernel.gcc_version not in (
        None,
        spec.toolchain.gcc,
    ):
        problems.append(
            f"the running kernel {kernel.release} was built by gcc {kernel.gcc_version} but "
            f"toolchain.gcc is {spec.toolchain.gcc}; modules built by another compiler must not be "
            "loaded into it (rebuild the kernel with the toolchain, or set toolchain.gcc)"
        )
    loader = facts.boot_tool.loader if facts.boot_tool else "grub"
    boot = _boot_config(spec, facts, loader, plan_cmdline(spec, facts.cpu_vendor, passthrough))
    problems += boot.problems
    if problems:
        raise PlanError(host, problems, source)

    names = {g.bdf: g.name for g in facts.gpus.gpus}
    all_functions = sorted(facts.pci)
    assignments = []
    for index, gpu in enumerate(gpus):
        owner = owners.get(gpu.bdf, HOST)
        assignments.append(
            GpuAssignment(
                index=index,
                bdf=gpu.bdf,
                model=names.get(gpu.bdf) or model_name(gpu.device),
                numa_node=gpu.numa_node,
                iommu_group=gpu.iommu_group,
                driver_now=gpu.driver,
                driver_planned="vfio-pci" if owner.kind == "vm" else "nvidia",
                owner=owner,
                functions=tuple(
                    b for b in all_functions if slot(b) == slot(gpu.bdf) and b != gpu.bdf
                ),
            )
        )
    visible = [g.bdf for g in facts.gpus.gpus]
    if visible and visible != [a.bdf for a in assignments if a.bdf in visible]:
        notes.append("nvidia-smi orders GPUs differently from PCI bus order; refer to GPUs by BDF")

    # nvidia_uvm is not autoloaded: without it at boot /dev/nvidia-uvm is missing when
    # containers start, and its options (uvm_disable_hmm) never apply.
    modules_load: dict[str, list[str]] = {}
    on_host = any(a.driver_planned == "nvidia" for a in assignments)
    if on_host:
        modules_load["nvidia"] = ["nvidia", "nvidia_uvm"]
    if any(a.owner.kind == "vm" for a in assignments):
        modules_load["vfio"] = list(spec.modules.vfio_modules)
    module_options: dict[str, dict[str, str]] = {}
    expected_parameters: dict[str, dict[str, str]] = {}
    if spec.modules.uvm_disable_hmm:
        module_options["nvidia_uvm"] = {"uvm_disable_hmm": "1"}
        expected_parameters["nvidia_uvm"] = {"uvm_disable_hmm": "Y"}
    blacklist = ["nouveau"] if spec.modules.blacklist_nouveau else []
    p2p = _expected_p2p(spec, facts, assignments, notes)
    guest_env = {owner_of_guest(g): dict(g.env) for g in spec.guests}
    if spec.p2p.unsafe_iommu:
        for owner in guest_env:
            guest_env[owner].setdefault("NCCL_P2P_DISABLE", "1")

    files = _files(
        {
            **{path: (content, "cmdline") for path, content in boot.files.items()},
            modconf.NVIDIA_OPTIONS: (modconf.options_file(module_options), "modules"),
            modconf.BLACKLIST: (modconf.blacklist_file(blacklist), "modules"),
            modconf.NVIDIA_LOAD: (
                modconf.load_file("nvidia at boot", modules_load.get("nvidia")),
                "modules",
            ),
            modconf.VFIO_LOAD: (
                modconf.load_file("vfio at boot", modules_load.get("vfio")),
                "modules",
            ),
        }
    )
    # The boot unit that makes the device nodes the containers bind-mount (the driver makes none).
    files[modconf.DEVICES_SCRIPT] = ManagedFile(
        modconf.DEVICES_SCRIPT,
        modconf.static_file("nvidia-device-nodes") if on_host else None,
        "devices",
        mode="755",
    )
    files[modconf.DEVICES_UNIT] = ManagedFile(
        modconf.DEVICES_UNIT,
        modconf.static_file("gpuhost-nvidia-devices.service") if on_host else None,
        "devices",
    )
    files[modconf.DEVICES_WANTS] = ManagedFile(
        modconf.DEVICES_WANTS, None, "devices", link=modconf.DEVICES_UNIT if on_host else None
    )

    tool = facts.boot_tool
    refresh = "proxmox-boot-tool refresh" if tool is not None and tool.configured else "update-grub"
    follow_ups = [
        FollowUp("loader", refresh, tuple(boot.files)),
        FollowUp("initramfs", "update-initramfs -u -k all", modconf.INITRAMFS_FILES),
        FollowUp("systemd", "systemctl daemon-reload", (modconf.DEVICES_UNIT,)),
    ]

    reasons: list[Reason] = []
    running = facts.cmdline
    add = [p for p in boot.present if p not in running]
    remove = [p for p in boot.absent if p in running]
    if add or remove:
        change = " ".join([f"+{p}" for p in add] + [f"-{p}" for p in remove])
        reasons.append(Reason("cmdline", f"kernel command line changes: {change}"))
    live = facts.module_parameters
    if "nouveau" in blacklist and "nouveau" in live:
        reasons.append(Reason("modules", "nouveau is loaded; the blacklist takes effect at boot"))
    driver = facts.driver
    live_uvm = live.get("nvidia_uvm", {})
    if driver is not None and not live_uvm and "nvidia" in modules_load:
        reasons.append(Reason("modules", "nvidia_uvm is not loaded; it must load at boot"))
    for name, value in expected_parameters.get("nvidia_uvm", {}).items():
        if name in live_uvm and live_uvm[name] != value:
            text = f"nvidia_uvm {name} is {live_uvm[name]}, must be {value} (module reload)"
            reasons.append(Reason("modules", text))
    if kernel.release != spec.kernel.version:
        text = f"kernel {spec.kernel.version} must boot (running {kernel.release})"
        reasons.append(Reason("kernel", text))
    flavour = "open" if spec.driver.open else "proprietary"
    if driver is None or driver.version != spec.driver.version or driver.open != spec.driver.open:
        now = (
            "none loaded"
            if driver is None
            else (f"loaded: {driver.version} ({'open' if driver.open else 'proprietary'})")
        )
        text = f"NVIDIA driver {spec.driver.version} ({flavour}) must load ({now})"
        reasons.append(Reason("driver", text))
    for a in assignments:
        if a.driver_now != a.driver_planned:
            text = f"GPU {a.bdf} binds {a.driver_planned} (now {a.driver_now or 'no driver'})"
            reasons.append(Reason("binding", text))

    # Never reboot into a kernel this run did not choose (an apt upgrade may have installed a
    # newer one, which would boot without a matching nvidia module): pin the running one.
    next_kernel = next_boot_kernel(facts)
    pin = False
    if any(r.concern in REBOOT_NOW for r in reasons):
        if next_kernel is None and facts.boot_kernels is None and loader == "systemd-boot":
            notes.append("the kernel the next boot starts is unknown (no proxmox-boot-tool)")
        elif next_kernel is not None and next_kernel != kernel.release:
            if facts.boot_kernels is None:
                raise PlanError(
                    host,
                    [
                        f"a reboot would start kernel {next_kernel}, not the running "
                        f"{kernel.release}, and gpuhost cannot pin it without proxmox-boot-tool; "
                        f"make {kernel.release} the default boot entry, or remove {next_kernel}"
                    ],
                    source,
                )
            pin = True
            notes.append(
                f"a reboot would start kernel {next_kernel}, not the running {kernel.release}: "
                f"the deploy pins {kernel.release} first (proxmox-boot-tool kernel pin)"
            )

    expected = [p for p in running if p not in remove]
    cut = expected.index("--") if "--" in expected else len(expected)
    expected = expected[:cut] + add + expected[cut:]
    return Plan(
        host=host,
        gpus=assignments,
        loader=loader,
        iommu_passthrough=passthrough,
        cmdline_owned=boot.owned,
        cmdline_present=boot.present,
        cmdline_absent=boot.absent,
        cmdline=expected,
        running_cmdline=list(running),
        files=files,
        follow_ups=follow_ups,
        module_options=module_options,
        blacklist=blacklist,
        modules_load=modules_load,
        expected_parameters=expected_parameters,
        p2p=p2p,
        guest_env=guest_env,
        running_kernel=kernel.release,
        next_boot_kernel=next_kernel,
        pin_running_kernel=pin,
        reboot_reasons=reasons,
        notes=notes,
    )
