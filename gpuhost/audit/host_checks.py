"""Host checks: GPUs and their binding, the driver, boot parameters, modules, device nodes."""

from __future__ import annotations

import re

from gpuhost import modconf
from gpuhost.audit.context import REDEPLOY, AuditContext, expected_minor, file_findings
from gpuhost.audit.model import Finding, NotApplicable, check
from gpuhost.split import HOST


def _nvidia_gpus(ctx: AuditContext) -> list[str]:
    return [a.bdf for a in ctx.plan.gpus if a.driver_planned == "nvidia"]


@check("gpus.inventory", "GPUs: count, model and BDF as the inventory says")
def gpus_inventory(ctx: AuditContext) -> list[Finding]:
    findings = []
    present = [a.bdf for a in ctx.plan.gpus]
    hw = ctx.plan.hardware
    if hw is not None and len(present) != hw.gpus:
        findings.append(
            Finding(
                "GPU count",
                f"{hw.gpus} NVIDIA GPUs (hardware.gpus)",
                f"{len(present)}: {', '.join(present) or 'none'}",
                "a GPU missing from the PCI bus: check dmesg and seating/power; else correct "
                "hardware.gpus in the inventory",
            )
        )
    if hw is not None and hw.gpu_model:
        for a in ctx.plan.gpus:
            if a.model != hw.gpu_model:
                findings.append(
                    Finding(
                        a.bdf,
                        f"model {hw.gpu_model!r}",
                        f"{a.model!r}",
                        "correct hardware.gpu_model",
                    )
                )
    listed = {g.bdf for g in ctx.host.facts.gpus.gpus}
    for bdf in _nvidia_gpus(ctx):
        if bdf not in listed:
            why = ctx.host.facts.gpus.error or "not listed"
            findings.append(
                Finding(bdf, "listed by nvidia-smi", why, "check `nvidia-smi` and dmesg (NVRM)")
            )
    return findings


@check("gpus.binding", "Each GPU (and its board's functions) bound to its planned driver")
def gpus_binding(ctx: AuditContext) -> list[Finding]:
    findings = []
    pci = ctx.host.facts.pci
    for a in ctx.plan.gpus:
        functions = [a.bdf, *a.functions] if a.driver_planned == "vfio-pci" else [a.bdf]
        for bdf in functions:
            live = pci[bdf].driver if bdf in pci else None
            if live != a.driver_planned:
                findings.append(
                    Finding(
                        bdf,
                        f"bound to {a.driver_planned} ({a.owner})",
                        f"bound to {live or 'no driver'}",
                        f"{REDEPLOY}, then reboot: the binding is made at boot before nvidia loads",
                    )
                )
    return findings


@check("driver.version", "The loaded NVIDIA kernel driver is the planned version and flavour")
def driver_version(ctx: AuditContext) -> list[Finding]:
    if not _nvidia_gpus(ctx):
        raise NotApplicable("no GPU stays on the nvidia driver")
    driver, want = ctx.host.facts.driver, ctx.spec.driver
    flavour = "open kernel module" if want.open else "proprietary kernel module"
    if driver is None:
        return [
            Finding("nvidia module", f"{want.version}, {flavour}", "not loaded", "load it / reboot")
        ]
    findings = []
    if driver.version != want.version:
        findings.append(
            Finding(
                "/proc/driver/nvidia/version",
                f"driver {want.version} (driver.version)",
                f"driver {driver.version}",
                "install the planned driver, or correct driver.version",
            )
        )
    if driver.open != want.open:
        findings.append(
            Finding(
                "/proc/driver/nvidia/version",
                flavour,
                "open kernel module" if driver.open else "proprietary kernel module",
                "install the planned flavour (Blackwell needs the open modules)",
            )
        )
    return findings


@check("driver.compiler", "The nvidia module was built by the compiler that built the kernel")
def driver_compiler(ctx: AuditContext) -> list[Finding]:
    driver, kernel = ctx.host.facts.driver, ctx.host.facts.kernel
    if driver is None:
        raise NotApplicable("the nvidia module is not loaded (driver.version says so)")
    if driver.gcc_version != kernel.gcc_version:
        return [
            Finding(
                "nvidia module vs running kernel",
                f"GCC {kernel.gcc_version} (/proc/version: the kernel's compiler)",
                f"GCC {driver.gcc_version} (/proc/driver/nvidia/version)",
                "rebuild the nvidia modules with the kernel's compiler (toolchain.gcc): a "
                "kernel/module pair from two compilers can crash the host",
            )
        ]
    return []


@check("driver.firmware", "GSP firmware on every GPU is the driver's version")
def driver_firmware(ctx: AuditContext) -> list[Finding]:
    version = ctx.driver_version
    if version is None:
        raise NotApplicable("the nvidia module is not loaded (driver.version says so)")
    info = ctx.host.facts.gpu_information
    findings = []
    for bdf in _nvidia_gpus(ctx):
        firmware = info.get(bdf, {}).get("GPU Firmware")
        if firmware != version:
            findings.append(
                Finding(
                    bdf,
                    f"GPU Firmware {version}",
                    f"GPU Firmware {firmware}" if firmware else "no firmware reported",
                    f"install the GSP firmware of driver {version} "
                    f"(/lib/firmware/nvidia/{version}/) and reload the driver",
                )
            )
    return findings


@check("driver.userspace", "The host's NVIDIA userspace equals the kernel driver exactly")
def driver_userspace(ctx: AuditContext) -> list[Finding]:
    version = ctx.driver_version
    if version is None:
        raise NotApplicable("the nvidia module is not loaded (driver.version says so)")
    findings = []
    for lib in ("libcuda", "libnvidia-ml"):
        found = ctx.host.userspace.get(lib, [])
        if found != [version]:
            findings.append(
                Finding(
                    f"{lib}.so.1",
                    f"version {version} (the kernel driver's)",
                    ", ".join(found) or "not installed",
                    f"install the userspace of driver {version} (e.g. the .run with "
                    "--no-kernel-modules) and remove other versions",
                )
            )
    return findings


@check("driver.next_boot", "The kernel that boots next has nvidia modules built for it")
def driver_next_boot(ctx: AuditContext) -> list[Finding]:
    kernel = ctx.plan.next_boot_kernel
    if kernel is None:
        raise NotApplicable("which kernel boots next is unknown here (no proxmox-boot-tool)")
    if not ctx.host.modules:
        raise NotApplicable("no /lib/modules on this host: its kernel is not installed here")
    modules = ctx.host.modules.get(kernel)
    findings = []
    if modules is None:
        return [Finding(kernel, "installed under /lib/modules", "missing", "reinstall the kernel")]
    for name in ("nvidia", "nvidia_uvm"):
        vermagic = modules.get(name)
        if vermagic is None or vermagic.split(" ", 1)[0] != kernel:
            findings.append(
                Finding(
                    f"{name} for {kernel}",
                    f"a module with vermagic '{kernel} ...'",
                    f"vermagic {vermagic!r}" if vermagic else "no module",
                    f"build the nvidia modules for {kernel} before rebooting, or pin the running "
                    f"kernel ({ctx.plan.running_kernel})",
                )
            )
    version = ctx.spec.driver.version
    if not ctx.host.firmware.get(version):
        findings.append(
            Finding(
                f"/lib/firmware/nvidia/{version}",
                "GSP firmware files (gsp_*.bin)",
                "missing",
                f"install the firmware of driver {version}: the open module fails to start GPUs "
                "without it",
            )
        )
    return findings


def _nvswitches(ctx: AuditContext) -> list[str]:
    return [
        d.bdf
        for d in ctx.host.facts.pci.values()
        if d.vendor == "10de" and d.class_code.startswith("0680")
    ]


@check("driver.fabricmanager", "nvidia-fabricmanager at the driver's version, running")
def driver_fabricmanager(ctx: AuditContext) -> list[Finding]:
    switches = _nvswitches(ctx)
    if not switches:
        raise NotApplicable("no NVSwitch on the PCI bus")
    version, fabric, findings = ctx.driver_version, ctx.host.fabric, []
    if fabric.version != version:
        findings.append(
            Finding(
                "nvidia-fabricmanager",
                f"version {version}",
                fabric.version or "not installed",
                f"install nvidia-fabricmanager {version}: CUDA does not start on NVSwitch boards "
                "without it",
            )
        )
    if fabric.active != "active":
        findings.append(
            Finding(
                "nvidia-fabricmanager.service",
                "active",
                fabric.active or "unknown",
                "systemctl enable --now nvidia-fabricmanager",
            )
        )
    return findings


@check("boot.kernel", "The running kernel is the planned one")
def boot_kernel(ctx: AuditContext) -> list[Finding]:
    running, want = ctx.host.facts.kernel.release, ctx.spec.kernel.version
    if not running.endswith("-pve"):
        raise NotApplicable(f"not a Proxmox kernel ({running}): kernel.version does not apply")
    if running != want:
        return [
            Finding(
                "uname -r",
                f"{want} (kernel.version)",
                running,
                f"{REDEPLOY}: it installs {want} and boots it through a trial boot",
            )
        ]
    return []


@check("boot.cmdline", "/proc/cmdline carries the planned parameters")
def boot_cmdline(ctx: AuditContext) -> list[Finding]:
    running = ctx.host.facts.cmdline
    fix = f"{REDEPLOY}: it writes the boot loader's command line and reboots for it"
    findings = [
        Finding("/proc/cmdline", f"contains {p}", "missing", fix)
        for p in ctx.plan.cmdline_present
        if p not in running
    ]
    findings += [
        Finding("/proc/cmdline", f"does not contain {p}", "present", fix)
        for p in ctx.plan.cmdline_absent
        if p in running
    ]
    return findings


@check("boot.loader", "The boot loader's command line files are the Plan's")
def boot_loader(ctx: AuditContext) -> list[Finding]:
    files = [f for f in ctx.plan.files.values() if f.concern == "cmdline"]
    return file_findings(ctx, files, REDEPLOY)


@check(
    "boot.iommu_groups", "IOMMU groups of passed-through GPUs are whole and hold no stray device"
)
def boot_iommu_groups(ctx: AuditContext) -> list[Finding]:
    if not ctx.plan.vm_functions:
        raise NotApplicable("no VM has GPUs")
    facts, findings = ctx.host.facts, []
    if not facts.iommu_groups:
        return [
            Finding(
                "/sys/kernel/iommu_groups",
                "IOMMU groups",
                "none: the IOMMU is off",
                f"{REDEPLOY} (it plans the IOMMU parameters) and enable the IOMMU in firmware",
            )
        ]
    for vmid, functions in ctx.plan.vm_functions.items():
        for a in (a for a in ctx.plan.gpus if a.owner.kind == "vm" and a.owner.id == vmid):
            group = next((g for g, members in facts.iommu_groups.items() if a.bdf in members), None)
            members = facts.iommu_groups.get(group, []) if group is not None else []
            stray = [
                b
                for b in members
                if b not in functions and not (b in facts.pci and facts.pci[b].is_bridge)
            ]
            if group is None or stray:
                findings.append(
                    Finding(
                        f"{a.bdf} (VM {vmid})",
                        f"an IOMMU group holding only {', '.join(functions)}",
                        f"group {group} with {', '.join(stray)}" if stray else "in no group",
                        "give the whole group to the VM, or split it (boot.acs_override), then "
                        "re-run the deploy",
                    )
                )
    return findings


@check("boot.snp", "SEV-SNP state is what the plan chose (keep SNP, or iommu=pt)")
def boot_snp(ctx: AuditContext) -> list[Finding]:
    sev = ctx.host.facts.sev
    if not sev.snp_host:
        raise NotApplicable("not an SEV-SNP host")
    passthrough = "iommu=pt" in ctx.host.facts.cmdline
    if ctx.plan.iommu_passthrough and not passthrough:
        return [Finding("iommu=pt", "in effect (boot.snp: give_up)", "absent", REDEPLOY)]
    if not ctx.plan.iommu_passthrough:
        findings = []
        if passthrough:
            findings.append(Finding("iommu=pt", "absent (boot.snp: keep)", "present", REDEPLOY))
        if sev.snp_usable is False:
            findings.append(
                Finding(
                    "kvm_amd sev_snp",
                    "Y (SNP kept)",
                    "N",
                    "SNP was withdrawn at boot: check the IOMMU mode and the firmware",
                )
            )
        return findings
    return []


@check("modules.parameters", "Module parameters (uvm_disable_hmm...) read as planned")
def modules_parameters(ctx: AuditContext) -> list[Finding]:
    if not ctx.plan.expected_parameters:
        raise NotApplicable("no module parameter is planned")
    live = ctx.host.facts.module_parameters
    findings = []
    for module, params in ctx.plan.expected_parameters.items():
        for name, value in params.items():
            found = live.get(module, {}).get(name)
            if found != value:
                findings.append(
                    Finding(
                        f"/sys/module/{module}/parameters/{name}",
                        value,
                        found if found is not None else f"{module} not loaded",
                        f"{REDEPLOY}: it writes the option and reboots (or reloads {module})",
                    )
                )
    return findings


@check("modules.loaded", "nouveau not loaded; vfio modules loaded when a VM has GPUs")
def modules_loaded(ctx: AuditContext) -> list[Finding]:
    loaded = ctx.host.facts.loaded_modules
    if loaded is None:
        raise NotApplicable("loaded modules not captured")
    findings = []
    if "nouveau" in ctx.plan.blacklist and "nouveau" in loaded:
        findings.append(
            Finding("nouveau", "not loaded (blacklisted)", "loaded", f"{REDEPLOY}; it reboots")
        )
    for module in ctx.plan.modules_load.get("vfio", []):
        if module not in loaded:
            findings.append(
                Finding(module, "loaded (a VM has GPUs)", "not loaded", f"{REDEPLOY}; reboot")
            )
    return findings


@check("modules.files", "modprobe.d and modules-load.d files are the Plan's")
def modules_files(ctx: AuditContext) -> list[Finding]:
    files = [f for f in ctx.plan.files.values() if f.concern == "modules"]
    return file_findings(ctx, files, REDEPLOY)


def _planned_nodes(ctx: AuditContext) -> list[str]:
    nodes = {n for ns in ctx.plan.lxc_nodes.values() for n in ns}
    return sorted(nodes, key=lambda n: (len(n), n))


@check("devices.nodes", "Every node the guests use exists on the host with the live major")
def devices_nodes(ctx: AuditContext) -> list[Finding]:
    planned = _planned_nodes(ctx)
    if not planned:
        raise NotApplicable("no container has GPUs")
    findings = []
    fix = (
        "start gpuhost-nvidia-devices.service (it makes the nodes at boot); "
        f"{REDEPLOY} if it is missing"
    )
    for path in planned:
        node = ctx.host.nodes.get(path)
        want = f"char {ctx.live_major(path)}:{expected_minor(path)}"
        if node is None:
            findings.append(Finding(path, want, "missing", fix))
        elif node.kind != "c" or (node.major, node.minor) != (
            ctx.live_major(path),
            expected_minor(path),
        ):
            findings.append(
                Finding(path, want, f"{node.kind} {node.numbers}", f"remove it; then {fix}")
            )
    return findings


@check("devices.boot_unit", "The unit that makes the nodes is enabled and ordered before guests")
def devices_boot_unit(ctx: AuditContext) -> list[Finding]:
    unit = ctx.plan.files.get(modconf.DEVICES_UNIT)
    if unit is None or unit.content is None:
        raise NotApplicable("no GPU stays on the nvidia driver")
    if not ctx.plan.lxc_nodes:
        raise NotApplicable("no container has GPUs: nothing needs the nodes before guests start")
    managed = [ctx.plan.files[p] for p in modconf.DEVICE_FILES if p in ctx.plan.files]
    findings = file_findings(ctx, managed, REDEPLOY)
    seen = ctx.host.facts.managed
    text = seen.files.get(modconf.DEVICES_UNIT, "") if seen else ""
    before = {w for m in re.finditer(r"^Before=(.*)$", text, re.M) for w in m[1].split()}
    if text and "pve-guests.service" not in before:
        findings.append(
            Finding(
                modconf.DEVICES_UNIT,
                "Before=pve-guests.service",
                f"Before={' '.join(sorted(before))}",
                REDEPLOY,
            )
        )
    return findings


def host_owned(ctx: AuditContext) -> list[str]:
    return [a.bdf for a in ctx.plan.gpus if a.owner == HOST and a.driver_planned == "nvidia"]
