"""Host checks of the GPUs and the NVIDIA driver: count, binding, version, compiler, firmware,
userspace, the next boot's modules, fabric manager."""

from __future__ import annotations

from gpuhost.audit.context import REDEPLOY, AuditContext
from gpuhost.audit.model import Finding, NotApplicable, check
from gpuhost.observe.pci import nvswitches


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


@check("driver.release", "An upgraded host runs its new release's kernel, with nvidia modules")
def driver_release(ctx: AuditContext) -> list[Finding]:
    change = ctx.plan.release_change
    if change is None:
        raise NotApplicable("no kernels of an earlier Proxmox VE release on this host")
    want, running = ctx.spec.kernel.version, ctx.plan.running_kernel
    findings = []
    if running in change.previous:
        findings.append(
            Finding(
                "uname -r",
                f"{want} (kernel.version), a kernel of {change.release}",
                f"{running}, built by gcc {change.previous[running]} before the upgrade",
                f"{REDEPLOY}: it trial-boots {want} and pins it",
            )
        )
    gcc = change.current.get(want)
    modules = ctx.host.modules.get(want, {})
    missing = [m for m in ("nvidia", "nvidia_uvm") if m not in modules]
    if gcc and missing:
        findings.append(
            Finding(
                f"{', '.join(missing)} for {want}",
                f"NVIDIA {ctx.spec.driver.version} modules built by gcc {gcc}",
                "none: the modules of the previous kernels do not load into it",
                f"build the NVIDIA {ctx.spec.driver.version} modules for {want} with gcc-"
                f"{gcc.split('.')[0]} (driver.source, or the driver's installer), then "
                f"{REDEPLOY}",
            )
        )
    return findings


@check("driver.fabricmanager", "nvidia-fabricmanager at the driver's version, running")
def driver_fabricmanager(ctx: AuditContext) -> list[Finding]:
    switches = nvswitches(ctx.host.facts.pci)
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
