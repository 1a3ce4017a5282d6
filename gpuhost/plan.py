"""The planner: spec + facts -> plan. Pure: no I/O, no host contact.

The plan is everything the deploy applies and the audit expects: which GPU goes to whom and
which driver it binds, the kernel command line, module options, expected P2P, and the reasons
a reboot will be needed. Splits that cannot work are refused with every problem named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from facts.pci import PciDevice
from gpuhost.gpus import model_name, needs_open_modules
from gpuhost.hostfacts import HostFacts
from gpuhost.spec import HostSpec, LxcGuest, VmGuest

# Link types of `nvidia-smi topo -m` across which the driver allows P2P: NVLink, or PCIe that
# stays under one switch or host bridge. NODE and SYS cross host bridges / sockets.
P2P_LINKS = ("PIX", "PXB", "PHB")


class PlanError(ValueError):
    """The spec cannot be applied to this host; every problem is listed."""

    def __init__(self, host: str, problems: list[str]) -> None:
        self.host, self.problems = host, problems
        lines = [f"host {host!r}: the GPU plan is refused ({len(problems)} problem(s))"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Owner:
    kind: str  # "host" | "lxc" | "vm"
    id: int | None = None
    name: str = ""

    def __str__(self) -> str:
        return "host" if self.kind == "host" else f"{self.kind} {self.id} ({self.name})"


HOST = Owner("host")


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


@dataclass
class Plan:
    host: str
    gpus: list[GpuAssignment]
    loader: str  # "systemd-boot" | "grub"
    iommu_passthrough: bool  # iommu=pt planned
    cmdline_add: list[str]  # managed parameters missing from the running command line
    cmdline_remove: list[str]  # parameters on the running command line that must go
    cmdline: list[str]  # the expected /proc/cmdline after the next boot
    module_options: dict[str, dict[str, str]]  # modprobe.d: module -> option -> value
    blacklist: list[str]
    modules_load: dict[str, list[str]]  # modules-load.d drop-in ("nvidia", "vfio") -> modules
    expected_parameters: dict[str, dict[str, str]]  # /sys/module/<m>/parameters after boot
    p2p: dict[tuple[str, str], bool | None]  # (bdf, bdf) -> P2P expected; None: not checked
    guest_env: dict[Owner, dict[str, str]]
    reboot_reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def needs_reboot(self) -> bool:
        return bool(self.reboot_reasons)

    def owner_of(self, bdf: str) -> Owner:
        return next(g.owner for g in self.gpus if g.bdf == bdf)


def _slot(bdf: str) -> str:
    return bdf.rsplit(".", 1)[0]


def _owner(guest: LxcGuest | VmGuest) -> Owner:
    return Owner("lxc" if isinstance(guest, LxcGuest) else "vm", guest.guest_id, guest.name)


def _describe(dev: PciDevice) -> str:
    driver = f", driver {dev.driver}" if dev.driver else ""
    return f"{dev.bdf} ([{dev.class_code[:4]}] {dev.vendor_device}{driver})"


def _assign(spec: HostSpec, gpus: list[PciDevice], problems: list[str]) -> dict[str, Owner]:
    """Resolve each guest's GPU references to BDFs; collect every problem."""
    by_bdf = {g.bdf: i for i, g in enumerate(gpus)}
    owners: dict[str, tuple[Owner, str]] = {}  # bdf -> (owner, how it was named)
    rest: list[tuple[int, Owner]] = []
    for i, guest in enumerate(spec.guests):
        owner = _owner(guest)
        if guest.gpus == "rest":
            rest.append((i, owner))
            continue
        for ref in guest.gpus:
            if isinstance(ref, int):
                if ref >= len(gpus):
                    problems.append(
                        f"guests[{i}] ({owner}): GPU index {ref} does not exist; this host has "
                        f"{len(gpus)} NVIDIA GPU(s)"
                        + (f" (indexes 0-{len(gpus) - 1})" if gpus else "")
                    )
                    continue
                bdf, named = gpus[ref].bdf, f"index {ref}"
            else:
                if ref not in by_bdf:
                    known = ", ".join(by_bdf) or "none"
                    problems.append(
                        f"guests[{i}] ({owner}): {ref} is not an NVIDIA GPU on this host (GPUs: {known})"
                    )
                    continue
                bdf, named = ref, ref
            if bdf in owners and owners[bdf][0] != owner:
                other, other_named = owners[bdf]
                problems.append(
                    f"guests[{i}] ({owner}): GPU {bdf} (named as {named}) is already given to "
                    f"{other} (named as {other_named}); a GPU has exactly one owner"
                )
                continue
            owners[bdf] = (owner, named)
    for i, owner in rest:
        left = [g.bdf for g in gpus if g.bdf not in owners]
        if not left:
            problems.append(
                f"guests[{i}] ({owner}) takes 'rest' of the GPUs, but all {len(gpus)} GPU(s) "
                "are already given to other guests"
            )
        for bdf in left:
            owners[bdf] = (owner, "rest")
    return {bdf: owner for bdf, (owner, _) in owners.items()}


def _check_iommu_groups(
    spec: HostSpec,
    facts: HostFacts,
    owners: dict[str, Owner],
    gpus: list[PciDevice],
    problems: list[str],
) -> list[str]:
    """A VM's GPU must take its whole IOMMU group: no other owner, no stray device in it.

    Groups are read from the running kernel. Where they will change at the next boot (the IOMMU
    is off now, or the planned ACS override is not active yet) the check cannot be made yet: it
    becomes a note, and the plan made after that boot (before any GPU is rebound) makes it.
    """
    vm_gpus = [g for g in gpus if owners.get(g.bdf, HOST).kind == "vm"]
    if vm_gpus and not facts.iommu_groups:
        return [
            "IOMMU groups are not visible (the IOMMU is off in the running kernel); the VM "
            "GPUs' isolation is checked after the reboot that turns it on"
        ]
    acs = spec.boot.acs_override
    pending = bool(acs) and f"pcie_acs_override={acs}" not in facts.cmdline
    found: list[str] = []
    gpu_slots = {_slot(g.bdf): owners.get(g.bdf, HOST) for g in gpus}
    for gpu in vm_gpus:
        owner = owners[gpu.bdf]
        if gpu.iommu_group is None:
            continue
        reported = {_slot(gpu.bdf)}
        for member in facts.iommu_groups.get(gpu.iommu_group, []):
            dev = facts.pci.get(member)
            if _slot(member) in reported or dev is None or dev.is_bridge:
                continue  # bridges and root ports may share a VM's group
            reported.add(_slot(member))
            other = gpu_slots.get(_slot(member))
            if other == owner:
                continue  # another function or GPU of the same owner
            if other is not None:
                found.append(
                    f"IOMMU group {gpu.iommu_group} is split: {gpu.bdf} goes to {owner} but {member} "
                    f"goes to {other}; every device of a group must go to the same VM "
                    "(give both to one VM, or split the group with boot.acs_override)"
                )
            else:
                found.append(
                    f"IOMMU group {gpu.iommu_group} of {gpu.bdf} ({owner}) also holds "
                    f"{_describe(dev)}, which is not assigned with it; set boot.acs_override to "
                    "split the group, or keep this GPU on the host"
                )
    if pending:
        return [
            f"{f.split(';')[0]}; pcie_acs_override={acs} is not active yet: checked again after the reboot"
            for f in found
        ]
    problems.extend(found)
    return []


def _check_vms(
    spec: HostSpec, facts: HostFacts, owners: dict[str, Owner], problems: list[str]
) -> list[str]:
    notes = []
    with_gpus = {o.id for o in owners.values() if o.kind == "vm"}
    for vm in spec.vm_guests:
        if vm.vmid not in with_gpus:
            continue
        config = facts.guest_configs.get(("qemu", vm.vmid))
        if vm.machine is not None:
            if config is None:
                notes.append(
                    f"vm {vm.vmid} ({vm.name}) has no config on this host yet; create it before deploying"
                )
            continue
        machine = config.current.options.get("machine") if config else None
        if config is None:
            problems.append(
                f"vm {vm.vmid} ({vm.name}) gets GPUs but does not exist here, so its machine type "
                "is unknown; create the VM or set machine: q35 in the spec"
            )
        elif machine is None or "q35" not in machine:
            shown = machine or "i440fx (the default, no 'machine' key)"
            problems.append(
                f"vm {vm.vmid} ({vm.name}) gets GPUs but its machine type is {shown}; PCIe "
                "passthrough needs q35: set machine: q35 in the spec"
            )
    return notes


def plan_cmdline(
    spec: HostSpec, cpu_vendor: str, running: list[str], passthrough: bool
) -> tuple[list[str], list[str], list[str]]:
    """(parameters to add, parameters to remove, expected command line) for the next boot.

    ``passthrough`` is the planned iommu=pt decision (see :func:`plan_passthrough`).
    """
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
    wanted += boot.extra
    extra_keys = {p.split("=", 1)[0] for p in boot.extra}

    def managed(param: str) -> bool:
        key = param.split("=", 1)[0]
        if key in ("intel_iommu", "amd_iommu", "iommu", "pcie_acs_override") or key in extra_keys:
            return True
        # pci=realloc is ours to add or remove; pci=realloc=off only conflicts when we want it on
        return param == "pci=realloc" or (boot.pci_realloc and param.startswith("pci=realloc"))

    # Everything after "--" is for init, not the kernel: manage and add only before it.
    cut = running.index("--") if "--" in running else len(running)
    kernel, init = running[:cut], running[cut:]
    remove = [p for p in kernel if managed(p) and p not in wanted]
    add = [p for p in wanted if p not in kernel]
    expected = [p for p in kernel if p not in remove] + add + init
    return add, remove, expected


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


def make_plan(host: str, spec: HostSpec, facts: HostFacts) -> Plan:
    problems: list[str] = []
    notes: list[str] = []
    gpus = sorted((d for d in facts.pci.values() if d.is_gpu), key=lambda d: d.bdf)
    wanted = sum(len(g.gpus) for g in spec.guests if g.gpus != "rest")
    if wanted > len(gpus):
        problems.append(f"the guests ask for {wanted} GPUs but this host has {len(gpus)}")
    owners = _assign(spec, gpus, problems)
    notes += _check_iommu_groups(spec, facts, owners, gpus, problems)
    notes += _check_vms(spec, facts, owners, problems)
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
    if problems:
        raise PlanError(host, problems)

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
                    b for b in all_functions if _slot(b) == _slot(gpu.bdf) and b != gpu.bdf
                ),
            )
        )
    visible = [g.bdf for g in facts.gpus.gpus]
    if visible and visible != [a.bdf for a in assignments if a.bdf in visible]:
        notes.append("nvidia-smi orders GPUs differently from PCI bus order; refer to GPUs by BDF")

    loader = facts.boot_tool.loader if facts.boot_tool else "grub"
    add, remove, cmdline = plan_cmdline(spec, facts.cpu_vendor, facts.cmdline, passthrough)
    # nvidia_uvm is not autoloaded: without it at boot /dev/nvidia-uvm is missing when
    # containers start, and its options (uvm_disable_hmm) never apply.
    modules_load: dict[str, list[str]] = {}
    if any(a.driver_planned == "nvidia" for a in assignments):
        modules_load["nvidia"] = ["nvidia", "nvidia_uvm"]
    if any(a.owner.kind == "vm" for a in assignments):
        modules_load["vfio"] = list(spec.modules.vfio_modules)
    module_options: dict[str, dict[str, str]] = {}
    expected_parameters: dict[str, dict[str, str]] = {}
    if spec.modules.uvm_disable_hmm:
        module_options["nvidia_uvm"] = {"uvm_disable_hmm": "1"}
        expected_parameters["nvidia_uvm"] = {"uvm_disable_hmm": "Y"}
    p2p = _expected_p2p(spec, facts, assignments, notes)
    guest_env = {_owner(g): dict(g.env) for g in spec.guests}
    if spec.p2p.unsafe_iommu:
        for owner in guest_env:
            guest_env[owner].setdefault("NCCL_P2P_DISABLE", "1")

    reasons: list[Reason] = []
    if add or remove:
        change = " ".join([f"+{p}" for p in add] + [f"-{p}" for p in remove])
        reasons.append(Reason("cmdline", f"kernel command line changes: {change}"))
    if kernel.release != spec.kernel.version:
        text = f"kernel {spec.kernel.version} must boot (running {kernel.release})"
        reasons.append(Reason("kernel", text))
    driver = facts.driver
    flavour = "open" if spec.driver.open else "proprietary"
    if driver is None or driver.version != spec.driver.version or driver.open != spec.driver.open:
        now = (
            "none loaded"
            if driver is None
            else (f"loaded: {driver.version} ({'open' if driver.open else 'proprietary'})")
        )
        text = f"NVIDIA driver {spec.driver.version} ({flavour}) must load ({now})"
        reasons.append(Reason("driver", text))
    live_uvm = facts.module_parameters.get("nvidia_uvm", {})
    if driver is not None and not live_uvm and "nvidia" in modules_load:
        reasons.append(Reason("modules", "nvidia_uvm is not loaded; it must load at boot"))
    for name, value in expected_parameters.get("nvidia_uvm", {}).items():
        if name in live_uvm and live_uvm[name] != value:
            text = f"nvidia_uvm {name} is {live_uvm[name]}, must be {value} (module reload)"
            reasons.append(Reason("modules", text))
    for a in assignments:
        if a.driver_now != a.driver_planned:
            text = f"GPU {a.bdf} binds {a.driver_planned} (now {a.driver_now or 'no driver'})"
            reasons.append(Reason("binding", text))

    return Plan(
        host=host,
        gpus=assignments,
        loader=loader,
        iommu_passthrough=passthrough,
        cmdline_add=add,
        cmdline_remove=remove,
        cmdline=cmdline,
        module_options=module_options,
        blacklist=["nouveau"] if spec.modules.blacklist_nouveau else [],
        modules_load=modules_load,
        expected_parameters=expected_parameters,
        p2p=p2p,
        guest_env=guest_env,
        reboot_reasons=reasons,
        notes=notes,
    )
