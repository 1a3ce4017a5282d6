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

import shlex
from dataclasses import dataclass, field

from gpuhost.observe.gpus import model_name, needs_open_modules
from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.boot.cmdline import KERNEL_CMDLINE
from gpuhost.plan.boot.files import after_commit, boot_config, loader_files
from gpuhost.plan.driver import modconf
from gpuhost.plan.driver.modules import DriverModules, plan_driver_modules
from gpuhost.plan.driver.userspace import (
    PERSISTENCED_UNIT,
    PERSISTENCED_WANTS,
    DriverUserspace,
    persistenced_unit,
    plan_driver_userspace,
)
from gpuhost.plan.guests.containers import ContainerDevices, plan_containers
from gpuhost.plan.guests.devices import guest_devices
from gpuhost.plan.guests.mappings import UNIT as MAPPINGS_UNIT
from gpuhost.plan.guests.mappings import boot_mappings, refresh_files
from gpuhost.plan.guests.split import (
    assign,
    check_fabric,
    check_iommu_groups,
    check_vms,
    owner_of_guest,
    slot,
)
from gpuhost.plan.guests.vfio import CLAIM_UNIT as VFIO_CLAIM_UNIT
from gpuhost.plan.guests.vfio import INITRAMFS_FILES as VFIO_INITRAMFS_FILES
from gpuhost.plan.guests.vfio import VfioBinding, plan_vfio, vfio_files
from gpuhost.plan.guests.vms import VmSplit, plan_vm_gpus
from gpuhost.plan.model import (
    HOST,
    REBOOT_NOW,
    FollowUp,
    GpuAssignment,
    ManagedFile,
    Owner,
    PlanError,
    Reason,
)
from gpuhost.plan.p2p import plan_p2p
from gpuhost.plan.preconditions import ControlFacts, Precondition, api_writes, plan_preconditions
from gpuhost.plan.reasons import (
    next_boot_kernel,
    pin_running_kernel,
    reboot_reasons,
)
from gpuhost.plan.trial.boot import TrialBoot, trial_entry_method
from gpuhost.plan.trial.grub import grub_trial_options
from gpuhost.plan.trial.params import panic_sysctls, trial_cmdline_names
from gpuhost.plan.trial.state import Step
from gpuhost.plan.trial.step import plan_trial
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
    # What the run needs from the control machine, checked before its first change.
    preconditions: list[Precondition] = field(default_factory=list)
    # A host upgraded to a new Proxmox VE release: its kernels on each side (upgradeplan.py).
    release_change: ReleaseChange | None = None

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


def _files(plan_parts: dict[str, tuple[str | None, str]]) -> dict[str, ManagedFile]:
    return {
        path: ManagedFile(path=path, content=content, concern=concern)
        for path, (content, concern) in plan_parts.items()
    }


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
    release_change = plan_release_change(spec, facts, problems, notes)
    loader = facts.boot_tool.loader if facts.boot_tool else "grub"
    # Every boot path gpuhost trials (systemd-boot, GRUB) tries every boot gpuhost causes through
    # a trial entry of its own, planned once the reasons to boot are known (below); elsewhere a
    # new kernel's trial is refused (and would carry its panic parameters on the managed line).
    entry_trials = trial_entry_method(facts.boot_path, facts.boot_tool)
    trial: TrialBoot | None = None
    step, trial_params = Step.CONVERGED, ()
    if not entry_trials:
        trial, step, trial_params = plan_trial(spec, facts, problems)
    boot, passthrough = boot_config(spec, facts, loader, problems, notes, trial_params)
    after_trial = {
        path: ManagedFile(path, content, "cmdline")
        for path, content in after_commit(spec, facts, loader, boot, trial_params).items()
    }

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
    p2p = dict(p2p_plan.pairs)
    notes += p2p_plan.notes
    guest_env = {owner_of_guest(g): dict(g.env) for g in spec.guests}
    for owner, env in p2p_plan.env.items():
        for name, value in env.items():
            guest_env.setdefault(owner, {}).setdefault(name, value)

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

    # The trial boot's deadline timer and the onboot guests' wait for the commit: installed on
    # every host, idle without a trial record.
    for path, shipped, mode in (
        (modconf.TRIAL_SCRIPT, "gpuhost-trial-deadline", "755"),
        (modconf.TRIAL_UNIT, "gpuhost-trial-deadline.service", "644"),
        (modconf.TRIAL_TIMER, "gpuhost-trial-deadline.timer", "644"),
        (modconf.TRIAL_HOLD_SCRIPT, "gpuhost-trial-hold", "755"),
        (modconf.TRIAL_HOLD_DROPIN, "gpuhost-trial-hold.conf", "644"),
    ):
        files[path] = ManagedFile(path, modconf.static_file(shipped), "trial", mode=mode)
    files[modconf.TRIAL_WANTS] = ManagedFile(
        modconf.TRIAL_WANTS, None, "trial", link=modconf.TRIAL_TIMER
    )
    # The persistence daemon's boot unit, with the userspace that brings its binary.
    userspace = plan_driver_userspace(spec, facts, problems)
    unit = persistenced_unit(userspace)
    files[PERSISTENCED_UNIT] = ManagedFile(PERSISTENCED_UNIT, unit, "userspace")
    files[PERSISTENCED_WANTS] = ManagedFile(
        PERSISTENCED_WANTS, None, "userspace", link=PERSISTENCED_UNIT if unit else None
    )

    tool = facts.boot_tool
    refresh = "proxmox-boot-tool refresh" if tool is not None and tool.configured else "update-grub"
    follow_ups = [
        FollowUp("loader", refresh, tuple(boot.files)),
        FollowUp(
            "initramfs",
            # the kernel that boots next only: never the fallback's (every other kernel's)
            f"update-initramfs -u -k {shlex.quote(spec.kernel.version)}",
            (*modconf.INITRAMFS_FILES, *VFIO_INITRAMFS_FILES),
        ),
        FollowUp(
            "systemd",
            "systemctl daemon-reload",
            (
                modconf.DEVICES_UNIT,
                modconf.TRIAL_UNIT,
                modconf.TRIAL_TIMER,
                modconf.TRIAL_HOLD_DROPIN,
                PERSISTENCED_UNIT,
                VFIO_CLAIM_UNIT,
                MAPPINGS_UNIT,
            ),
        ),
    ]

    running = facts.cmdline
    add = [p for p in boot.present if p not in running]
    remove = [p for p in boot.absent if p in running]
    reasons = reboot_reasons(
        spec, facts, add, remove, blacklist, modules_load, expected_parameters, assignments
    )

    expected = [p for p in running if p not in remove]
    cut = expected.index("--") if "--" in expected else len(expected)
    expected = expected[:cut] + add + expected[cut:]
    trial_names = set(trial_cmdline_names())
    panic = panic_sysctls(
        [p for p in expected if p.split("=", 1)[0] not in trial_names or p in spec.boot.extra]
    )
    if entry_trials:
        boot_due = any(r.concern in REBOOT_NOW for r in reasons)
        if entry_trials == "systemd-boot":  # the entry's options: /etc/kernel/cmdline's line
            options = (boot.files.get(KERNEL_CMDLINE) or "").split("\n", 1)[0]
        else:  # GRUB: what 10_linux will render from the planned /etc/default/grub(.d)
            options = grub_trial_options(running, {**loader_files(facts, loader), **boot.files})
        trial, step, _ = plan_trial(spec, facts, problems, boot_due, options)
        if trial is not None and trial.entry_options is not None:
            after_trial = {p: ManagedFile(p, c, "cmdline") for p, c in boot.files.items()}

    next_kernel = next_boot_kernel(facts)
    pin = pin_running_kernel(facts, next_kernel, reasons, problems, notes)
    if problems:
        raise PlanError(host, problems, source)

    rebooting = any(r.concern in REBOOT_NOW for r in reasons) or step is not Step.CONVERGED
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
        raise PlanError(host, problems, source)
    # Each GPU container's entries (gpuhost/plan/guests/containers.py); raw rules wait for a run without reboot.
    containers = plan_containers(spec, facts, lxc_nodes, rebooting, problems, notes)
    if problems:
        raise PlanError(host, problems, source)
    vfio = plan_vfio(vm_functions, {bdf: d.class_code for bdf, d in facts.pci.items()})
    for path, content, mode, link in vfio_files(vfio):
        files[path] = ManagedFile(path, content, "vfio", mode=mode, link=link)
    for path, content, mode, link in refresh_files(boot_mappings(vm_functions, facts)):
        files[path] = ManagedFile(path, content, "mappings", mode=mode, link=link)
    driver_modules = plan_driver_modules(spec, facts)
    preconditions = plan_preconditions(
        spec, facts, api_writes(vm_split, facts), driver_modules, userspace, control
    )
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
        lxc_nodes=lxc_nodes,
        vm_functions=vm_functions,
        vm_split=vm_split,
        hardware=spec.hardware,
        trial_boot=trial,
        trial_step=step,
        trial_commit_files=after_trial,
        panic_sysctls=panic,
        target_kernel=spec.kernel.version,
        driver_modules=driver_modules,
        driver_userspace=userspace,
        containers=containers,
        vfio=vfio,
        preconditions=preconditions,
        release_change=release_change,
    )
