"""The planner: spec + facts -> Plan. Pure: no I/O, no host contact.

The Plan is the one description of the desired state: which GPU goes to whom and which driver
binds it, every managed file's path and content (or absence), the kernel command line, module
options, the follow-up steps those files need, expected P2P, every reason to reboot, whether
this run reboots and which guests stop and start around it. Deploys apply it, `gpuhost plan` and `--dry` render it, the audit checks it. Splits that cannot work are
refused with every problem named.

Reasons to reboot are read from what the host shows (the running command line, live module
parameters), never from what a run changed: a run killed anywhere converges on the next.

make_plan chains the phases of gpuhost/plan/phases.py; the Plan's parts are gpuhost/plan/model.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan import hostfiles, phases
from gpuhost.plan.driver.modules import DriverModules, plan_driver_modules
from gpuhost.plan.driver.userspace import DriverUserspace, plan_driver_userspace
from gpuhost.plan.guests.containers import ContainerDevices
from gpuhost.plan.guests.power import GuestPower
from gpuhost.plan.guests.readiness import Readiness, plan_readiness
from gpuhost.plan.guests.vfio import VfioBinding
from gpuhost.plan.guests.vms import VmSplit
from gpuhost.plan.model import (
    REBOOT_NOW,
    FollowUp,
    GpuAssignment,
    ManagedFile,
    Owner,
    PlanError,
    Reason,
)
from gpuhost.plan.monitoring import MonitoringPlan, plan_monitoring
from gpuhost.plan.preconditions import ControlFacts, Precondition, api_writes, plan_preconditions
from gpuhost.plan.secure_boot import check_secure_boot
from gpuhost.plan.trial.boot import TrialBoot
from gpuhost.plan.trial.state import Step
from gpuhost.plan.upgrade import ReleaseChange, plan_release_change
from gpuhost.spec.host import HardwareSpec, HostSpec

__all__ = ["Plan", "make_plan"]


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
    # This run boots the host: for a reason of its own (reboot_now) or a step of a trial boot.
    rebooting: bool = False
    notes: list[str] = field(default_factory=list)
    # Device nodes each GPU container needs (ctid -> host paths), and the PCI functions each VM
    # must be given whole (vmid -> BDFs: its GPUs' boards and the rest of their IOMMU groups).
    lxc_nodes: dict[int, tuple[str, ...]] = field(default_factory=dict)
    vm_functions: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # The VMs' PCI mappings and owned hostpciN entries (gpuhost/plan/guests/vms.py).
    vm_split: VmSplit = field(default_factory=VmSplit)
    hardware: HardwareSpec | None = None  # the GPUs the host must carry
    # How the planned kernel would be booted once before it is pinned (None: it is running).
    # A refused trial is not a plan problem: the deploy refuses it before anything changes, and
    # the plan and the audit still show everything else.
    trial_boot: TrialBoot | None = None
    trial_step: Step = Step.CONVERGED  # which step of the trial is due, from the host alone
    # The loader files as the trial's commit leaves them, written just before the commit, whose
    # own loader refresh applies them: on systemd-boot the planned command line (the trial entry
    # carried it; /etc/kernel/cmdline kept the fallback's), on GRUB without the panic parameters.
    trial_commit_files: dict[str, ManagedFile] = field(default_factory=dict)
    # /proc/sys/kernel panic settings the host runs guests with (0 unless the spec's own
    # parameters ask): a trial boot runs with them on, and the commit sets them back.
    panic_sysctls: dict[str, str] = field(default_factory=dict)
    target_kernel: str = ""  # spec.kernel.version
    driver_modules: DriverModules | None = None  # None: the spec leaves them unmanaged
    driver_userspace: DriverUserspace | None = None  # None: no driver.source.installer
    # Each container's GPU entries (devN or raw lines) and what changes (gpuhost/plan/guests/containers.py).
    containers: dict[int, ContainerDevices] = field(default_factory=dict)
    vfio: VfioBinding | None = None  # the VMs' functions bound to vfio-pci at boot (vfioplan.py)
    # Which guests stop and start, in which order (gpuhost/plan/phases.py plan_power): around
    # this run's reboot or trial boot, and, without one, around moving GPUs between guests.
    # None: the facts lack the guests' statuses (a plan to read, not to deploy).
    guest_power: GuestPower | None = None
    moving_guests: GuestPower | None = None
    # What the run needs from the control machine, checked before its first change.
    preconditions: list[Precondition] = field(default_factory=list)
    # A host upgraded to a new Proxmox VE release: its kernels on each side (upgradeplan.py).
    release_change: ReleaseChange | None = None
    # The metrics timer and node_exporter (gpuhost/plan/monitoring.py); None: monitoring is off.
    monitoring: MonitoringPlan | None = None
    # Each GPU guest's hookscript and readiness contract (gpuhost/plan/guests/readiness.py).
    readiness: Readiness = field(default_factory=Readiness)

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
    def boot_config_at_commit(self) -> bool:
        """The loader files and the initramfs wait for the trial's commit: the trial boots an
        entry of its own with them, and the fallback's stay as they were until it passed."""
        trial = self.trial_boot
        return (
            trial is not None
            and trial.entry_options is not None
            and self.trial_step is not Step.CONVERGED
        )

    @property
    def needs_reboot(self) -> bool:
        return bool(self.reboot_reasons)

    def owner_of(self, bdf: str) -> Owner:
        return next(g.owner for g in self.gpus if g.bdf == bdf)


def make_plan(
    host: str,
    spec: HostSpec,
    facts: HostFacts,
    source: str | None = None,
    control: ControlFacts | None = None,
) -> Plan:
    """+ control: what the control machine showed (gpuhost/control.py); None: the plan's
    preconditions are listed as not checked"""
    problems: list[str] = []
    notes: list[str] = []
    assignments = phases.split_gpus(spec, facts, problems, notes)
    phases.check_toolchain(spec, facts, problems)
    check_secure_boot(spec, facts, problems)
    release_change = plan_release_change(spec, facts, problems, notes)
    boot = phases.plan_boot(spec, facts, problems, notes)
    phases.note_gpu_order(facts, assignments, notes)
    modules = phases.plan_modules(spec, assignments)
    p2p, guest_env = phases.plan_guest_p2p(spec, facts, assignments, boot.passthrough, notes)
    userspace = plan_driver_userspace(spec, facts, problems)
    on_host = any(a.driver_planned == "nvidia" for a in assignments)
    files = hostfiles.host_files(boot.config, modules, on_host, userspace)
    reboot = phases.decide_reboot(spec, facts, boot, modules, assignments, problems, notes)
    if problems:
        raise PlanError(host, problems, source)
    guests = phases.plan_guest_devices(spec, facts, assignments, reboot.rebooting, problems, notes)
    if guests is None:
        raise PlanError(host, problems, source)
    files.update(guests.files)
    monitoring, monitoring_files = plan_monitoring(host, spec, facts)
    files.update(monitoring_files)
    driver_modules = plan_driver_modules(spec, facts)
    # The host runs the spec's driver once this run is done: it does now, or this run boots it.
    loaded = facts.driver is not None and facts.driver.version == spec.driver.version
    driver_runs = loaded or (reboot.rebooting and driver_modules is not None)
    readiness = plan_readiness(
        spec, facts, assignments, guests.lxc_nodes, guests.vm_functions, guests.vm_split,
        guests.containers,
        (driver_runs, userspace is not None, bool(userspace and userspace.nvswitches)),
        problems,
    )  # fmt: skip
    files.update(readiness.files)
    power = phases.plan_power(facts, reboot, boot.step, guests, problems)
    if problems:
        raise PlanError(host, problems, source)
    preconditions = plan_preconditions(
        spec, facts, api_writes(guests.vm_split, facts), driver_modules, userspace, control
    )
    return Plan(
        host=host,
        gpus=assignments,
        loader=boot.loader,
        iommu_passthrough=boot.passthrough,
        cmdline_owned=boot.config.owned,
        cmdline_present=boot.config.present,
        cmdline_absent=boot.config.absent,
        cmdline=reboot.cmdline,
        running_cmdline=list(facts.cmdline),
        files=files,
        follow_ups=hostfiles.follow_ups(spec, facts, boot.config),
        module_options=modules.options,
        blacklist=modules.blacklist,
        modules_load=modules.load,
        expected_parameters=modules.expected_parameters,
        p2p=p2p,
        guest_env=guest_env,
        running_kernel=facts.kernel.release,
        next_boot_kernel=reboot.next_kernel,
        pin_running_kernel=reboot.pin,
        reboot_reasons=reboot.reasons,
        rebooting=reboot.rebooting,
        notes=notes,
        lxc_nodes=guests.lxc_nodes,
        vm_functions=guests.vm_functions,
        vm_split=guests.vm_split,
        hardware=spec.hardware,
        trial_boot=boot.trial,
        trial_step=boot.step,
        trial_commit_files=boot.commit_files,
        panic_sysctls=reboot.panic_sysctls,
        target_kernel=spec.kernel.version,
        driver_modules=driver_modules,
        driver_userspace=userspace,
        containers=guests.containers,
        vfio=guests.vfio,
        guest_power=power.around_boot,
        moving_guests=power.moving,
        preconditions=preconditions,
        release_change=release_change,
        monitoring=monitoring,
        readiness=readiness,
    )
