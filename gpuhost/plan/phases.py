"""The planner's phases, in the order make_plan (gpuhost/plan/make.py) chains them: the GPU split,
the boot configuration, the modules, P2P, the host's managed files (gpuhost/plan/hostfiles.py),
the reboot decision, the guests' devices and the guests' power. Each reads the spec and the facts plus what an earlier
phase decided, appends to ``problems`` what cannot be applied and to ``notes`` what the user
should know, and returns what it decided."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuhost.observe.gpus import model_name, needs_open_modules
from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.boot.cmdline import KERNEL_CMDLINE, BootConfig
from gpuhost.plan.boot.files import after_commit, boot_config, loader_files
from gpuhost.plan.guests.containers import ContainerDevices, plan_containers
from gpuhost.plan.guests.devices import guest_devices
from gpuhost.plan.guests.mappings import boot_mappings, refresh_files
from gpuhost.plan.guests.power import (
    RECORD as GUEST_RECORD,
)
from gpuhost.plan.guests.power import (
    GuestId,
    GuestPower,
    StartupFormatError,
    guests_from_configs,
    parse_record,
    plan_guest_power,
)
from gpuhost.plan.guests.split import (
    assign,
    check_fabric,
    check_iommu_groups,
    check_vms,
    owner_of_guest,
    slot,
)
from gpuhost.plan.guests.vfio import VfioBinding, plan_vfio, vfio_files
from gpuhost.plan.guests.vms import VmSplit, plan_vm_gpus
from gpuhost.plan.model import HOST, REBOOT_NOW, GpuAssignment, ManagedFile, Owner, Reason
from gpuhost.plan.p2p import plan_p2p
from gpuhost.plan.reasons import next_boot_kernel, pin_running_kernel, reboot_reasons
from gpuhost.plan.trial.boot import TrialBoot, trial_entry_method
from gpuhost.plan.trial.grub import grub_trial_options
from gpuhost.plan.trial.params import panic_sysctls, trial_cmdline_names, without_trial_parameters
from gpuhost.plan.trial.state import Step
from gpuhost.plan.trial.step import plan_trial
from gpuhost.spec.host import HostSpec

# --- the GPU split ---------------------------------------------------------------------------


def split_gpus(
    spec: HostSpec, facts: HostFacts, problems: list[str], notes: list[str]
) -> list[GpuAssignment]:
    """Which GPU goes to whom and which driver binds it, in PCI bus order; refusals for splits
    that cannot work (too few GPUs, fabric, IOMMU groups, VM machine types, Blackwell)."""
    gpus = sorted((d for d in facts.pci.values() if d.is_gpu), key=lambda d: d.bdf)
    wanted = sum(len(g.gpus) for g in spec.guests if g.gpus != "rest")
    if wanted > len(gpus):
        problems.append(f"the guests ask for {wanted} GPUs but this host has {len(gpus)}")
    owners = assign(spec, gpus, problems)
    check_fabric(facts, owners, gpus, problems)
    notes += check_iommu_groups(spec, facts, owners, gpus, problems)
    notes += check_vms(spec, facts, owners, problems)
    if not spec.driver.open:
        blackwell = [g.bdf for g in gpus if needs_open_modules(g.device)]
        if blackwell:
            problems.append(
                f"driver.open is false but {', '.join(blackwell)} are Blackwell GPUs, which only "
                "the open kernel modules support; set driver.open: true"
            )
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
    return assignments


def note_gpu_order(facts: HostFacts, assignments: list[GpuAssignment], notes: list[str]) -> None:
    visible = [g.bdf for g in facts.gpus.gpus]
    if visible and visible != [a.bdf for a in assignments if a.bdf in visible]:
        notes.append("nvidia-smi orders GPUs differently from PCI bus order; refer to GPUs by BDF")


def check_toolchain(spec: HostSpec, facts: HostFacts, problems: list[str]) -> None:
    """Modules built by another compiler than the running kernel's must not be loaded into it."""
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


# --- the boot configuration ------------------------------------------------------------------


@dataclass
class BootPlan:
    loader: str  # "systemd-boot" | "grub"
    config: BootConfig
    passthrough: bool  # iommu=pt planned
    entry_trials: str | None  # the loader whose trial entry tries every boot gpuhost causes
    trial: TrialBoot | None
    step: Step
    commit_files: dict[str, ManagedFile]  # the loader files as the trial's commit leaves them


def plan_boot(spec: HostSpec, facts: HostFacts, problems: list[str], notes: list[str]) -> BootPlan:
    """The loader files and the command line. Every boot path gpuhost trials (systemd-boot,
    GRUB) tries every boot gpuhost causes through a trial entry of its own, planned once the
    reasons to boot are known (decide_reboot); elsewhere a new kernel's trial is planned here
    (and carries its panic parameters on the managed line)."""
    loader = facts.boot_tool.loader if facts.boot_tool else "grub"
    entry_trials = trial_entry_method(facts.boot_path, facts.boot_tool) or None
    trial: TrialBoot | None = None
    step, trial_params = Step.CONVERGED, ()
    if not entry_trials:
        trial, step, trial_params = plan_trial(spec, facts, problems)
    config, passthrough = boot_config(
        spec, facts, loader, problems, notes, trial_params, frozenset(trial_cmdline_names())
    )
    commit_files = {
        path: ManagedFile(path, content, "cmdline")
        for path, content in after_commit(spec, facts, loader, config, trial_params).items()
    }
    return BootPlan(loader, config, passthrough, entry_trials, trial, step, commit_files)


# --- modules ---------------------------------------------------------------------------------


@dataclass
class ModulePlan:
    load: dict[str, list[str]]  # modules-load.d drop-in ("nvidia", "vfio") -> modules
    options: dict[str, dict[str, str]]  # modprobe.d: module -> option -> value
    expected_parameters: dict[str, dict[str, str]]  # /sys/module/<m>/parameters after boot
    blacklist: list[str]


# Each module option the spec can ask for, and how /sys/module/<m>/parameters shows it once
# loaded: the option's value on modprobe.d, the parameter's reading after boot.
PARAMETERS: dict[str, tuple[str, str, str, str]] = {
    # spec.modules field -> (module, parameter, option value, sysfs reading)
    "uvm_disable_hmm": ("nvidia_uvm", "uvm_disable_hmm", "1", "Y"),
}


def plan_modules(spec: HostSpec, assignments: list[GpuAssignment]) -> ModulePlan:
    """What loads at boot, with which options, and what must not load."""
    # nvidia_uvm is not autoloaded: without it at boot /dev/nvidia-uvm is missing when
    # containers start, and its options (uvm_disable_hmm) never apply.
    load: dict[str, list[str]] = {}
    if any(a.driver_planned == "nvidia" for a in assignments):
        load["nvidia"] = ["nvidia", "nvidia_uvm"]
    if any(a.owner.kind == "vm" for a in assignments):
        load["vfio"] = list(spec.modules.vfio_modules)
    options: dict[str, dict[str, str]] = {}
    expected: dict[str, dict[str, str]] = {}
    for field_name, (module, name, value, reads) in PARAMETERS.items():
        if getattr(spec.modules, field_name):
            options.setdefault(module, {})[name] = value
            expected.setdefault(module, {})[name] = reads
    blacklist = ["nouveau"] if spec.modules.blacklist_nouveau else []
    return ModulePlan(load, options, expected, blacklist)


# --- P2P -------------------------------------------------------------------------------------


def plan_guest_p2p(
    spec: HostSpec,
    facts: HostFacts,
    assignments: list[GpuAssignment],
    passthrough: bool,
    notes: list[str],
) -> tuple[dict[tuple[str, str], bool | None], dict[Owner, dict[str, str]]]:
    """The P2P expected between GPUs of one owner, and each guest's environment (the spec's,
    plus what P2P needs where it must be switched off)."""
    topo = facts.topology
    p2p_plan = plan_p2p(
        gpus=[(a.bdf, a.owner, a.driver_planned == "nvidia") for a in assignments],
        smi_names={g.bdf: f"GPU{g.index}" for g in facts.gpus.gpus},
        read=facts.p2p.get("r"),
        write=facts.p2p.get("w"),
        links=topo.links if topo else None,
        expected=spec.p2p.expected,
        unsafe_iommu=spec.p2p.unsafe_iommu,
        snp_host=facts.sev.snp_host,
        identity_domains=passthrough,
        host=HOST,
    )
    notes += p2p_plan.notes
    guest_env = {owner_of_guest(g): dict(g.env) for g in spec.guests}
    for owner, env in p2p_plan.env.items():
        for name, value in env.items():
            guest_env.setdefault(owner, {}).setdefault(name, value)
    return dict(p2p_plan.pairs), guest_env


# --- the reboot decision ---------------------------------------------------------------------


@dataclass
class RebootPlan:
    reasons: list[Reason]
    cmdline: list[str]  # the expected /proc/cmdline after the next boot
    panic_sysctls: dict[str, str]
    next_kernel: str | None
    pin: bool
    rebooting: bool  # this run boots the host (its own reasons or a trial step)


def decide_reboot(
    spec: HostSpec,
    facts: HostFacts,
    boot: BootPlan,
    modules: ModulePlan,
    assignments: list[GpuAssignment],
    problems: list[str],
    notes: list[str],
) -> RebootPlan:
    """Why the host needs a boot (read off what it shows), the command line that boot must show,
    the trial entry that tries it where the loader has one (it updates ``boot``), and whether
    the running kernel must be pinned first."""
    running = facts.cmdline
    config = boot.config
    add = [p for p in config.present if p not in running]
    remove = [p for p in config.absent if p in running]
    reasons = reboot_reasons(
        spec,
        facts,
        add,
        remove,
        modules.blacklist,
        modules.load,
        modules.expected_parameters,
        assignments,
    )
    expected = [p for p in running if p not in remove]
    cut = expected.index("--") if "--" in expected else len(expected)
    expected = expected[:cut] + add + expected[cut:]
    panic = panic_sysctls(without_trial_parameters(expected))
    if boot.entry_trials:
        boot_due = any(r.concern in REBOOT_NOW for r in reasons)
        if boot.entry_trials == "systemd-boot":  # the entry's options: /etc/kernel/cmdline's line
            options = (config.files.get(KERNEL_CMDLINE) or "").split("\n", 1)[0]
        else:  # GRUB: what 10_linux will render from the planned /etc/default/grub(.d)
            planned = {**loader_files(facts, boot.loader), **config.files}
            options = grub_trial_options(running, planned)
        boot.trial, boot.step, _ = plan_trial(spec, facts, problems, boot_due, options)
        if boot.trial is not None and boot.trial.entry_options is not None:
            boot.commit_files = {p: ManagedFile(p, c, "cmdline") for p, c in config.files.items()}
    next_kernel = next_boot_kernel(facts)
    pin = pin_running_kernel(facts, next_kernel, reasons, problems, notes)
    rebooting = any(r.concern in REBOOT_NOW for r in reasons) or boot.step is not Step.CONVERGED
    return RebootPlan(reasons, expected, panic, next_kernel, pin, rebooting)


# --- the guests' devices ---------------------------------------------------------------------


@dataclass
class GuestDevices:
    lxc_nodes: dict[int, tuple[str, ...]]
    vm_functions: dict[int, tuple[str, ...]]
    vm_split: VmSplit
    containers: dict[int, ContainerDevices]
    vfio: VfioBinding
    files: dict[str, ManagedFile] = field(default_factory=dict)  # vfio binding, PCI mappings


def plan_guest_devices(
    spec: HostSpec,
    facts: HostFacts,
    assignments: list[GpuAssignment],
    rebooting: bool,
    problems: list[str],
    notes: list[str],
) -> GuestDevices | None:
    """Each container's device nodes and entries, each VM's functions, mappings and owned
    hostpci entries, the vfio-pci binding at boot; None when refused (``problems``)."""
    lxc_nodes, vm_functions = guest_devices(assignments, facts, rebooting)
    vm_split = plan_vm_gpus(
        vm_functions,
        {vm.vmid: vm.name for vm in spec.vm_guests},
        {vm.vmid: vm.machine for vm in spec.vm_guests},
        {slot(a.bdf): str(a.owner) for a in assignments if a.owner.kind != "host"},
        facts,
        problems,
    )
    if problems:
        return None
    # Each GPU container's entries; raw rules wait for a run without reboot.
    containers = plan_containers(spec, facts, lxc_nodes, rebooting, problems, notes)
    if problems:
        return None
    vfio = plan_vfio(vm_functions, {bdf: d.class_code for bdf, d in facts.pci.items()})
    files: dict[str, ManagedFile] = {}
    for path, content, mode, link in vfio_files(vfio):
        files[path] = ManagedFile(path, content, "vfio", mode=mode, link=link)
    for path, content, mode, link in refresh_files(boot_mappings(vm_functions, facts)):
        files[path] = ManagedFile(path, content, "mappings", mode=mode, link=link)
    return GuestDevices(lxc_nodes, vm_functions, vm_split, containers, vfio, files)


# --- the guests' power -----------------------------------------------------------------------


@dataclass(frozen=True)
class PowerPlan:
    around_boot: GuestPower | None  # stopped before this run's (trial) boot, started after it
    moving: GuestPower | None  # no boot in this run: the guests whose GPUs move


def plan_power(
    facts: HostFacts,
    reboot: RebootPlan,
    step: Step,
    devices: GuestDevices,
    problems: list[str],
) -> PowerPlan:
    """Which guests stop and start, in which order: around the run's reboot (or its trial
    boot's reboot) every running guest; without a boot, the running guests whose GPUs move.
    An earlier run's record of guests to bring back joins both. None where the facts lack the
    guests' statuses (the plan is then for reading, not for a deploy)."""
    if facts.guest_statuses is None or facts.managed is None:
        return PowerPlan(None, None)
    try:
        guests = guests_from_configs(facts.guest_configs)
    except StartupFormatError as exc:
        problems.append(str(exc))
        return PowerPlan(None, None)
    recorded = parse_record(facts.managed.files.get(GUEST_RECORD))
    # A trial step reboots only at its start; otherwise the reboot is the plan's own.
    stops = step is Step.START if step is not Step.CONVERGED else reboot.rebooting
    around = plan_guest_power(guests, facts.guest_statuses, recorded, rebooting=stops)
    if reboot.rebooting:
        return PowerPlan(around, None)
    moving: set[GuestId] = {("qemu", v) for v, vm in devices.vm_split.vms.items() if vm.changes}
    moving |= {
        ("lxc", ctid) for ctid, ct in devices.containers.items() if ct.changes_config or ct.restart
    }
    statuses = {g: s for g, s in facts.guest_statuses.items() if g in moving}
    return PowerPlan(around, plan_guest_power(guests, statuses, recorded, rebooting=True))
