"""Host checks of boot, modules and device nodes: the running kernel and command line, IOMMU
groups, SEV-SNP, module parameters and files, the nodes containers use and the unit making them."""

from __future__ import annotations

import re

from gpuhost.audit.context import REDEPLOY, AuditContext, expected_minor, file_findings
from gpuhost.audit.model import Finding, NotApplicable, check
from gpuhost.plan.driver import modconf


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


@check("boot.panic", "The live panic settings are the Plan's: no trial boot's are left on")
def boot_panic(ctx: AuditContext) -> list[Finding]:
    live = ctx.host.facts.panic
    if live is None:
        raise NotApplicable("/proc/sys/kernel was not read (an older capture)")
    fix = (
        f"{REDEPLOY}: it sets them back (a trial boot runs with them on); to keep one, put its "
        "parameter in boot.extra"
    )
    return [
        Finding(f"/proc/sys/kernel/{name}", want, live[name], fix)
        for name, want in sorted(ctx.plan.panic_sysctls.items())
        if name in live and live[name] != want
    ]


@check("boot.loader", "The boot loader's command line files are the Plan's")
def boot_loader(ctx: AuditContext) -> list[Finding]:
    files = [f for f in ctx.plan.files.values() if f.concern == "cmdline"]
    return file_findings(ctx, files, REDEPLOY)


@check(
    "boot.iommu_groups",
    "IOMMU groups of passed-through GPUs are whole and hold no stray device; the boot unit that "
    "refreshes the groups in their mappings is the Plan's",
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
    # the boot unit that gives the VMs' mappings these groups before pve-guests starts them
    refresh = [f for f in ctx.plan.files.values() if f.concern == "mappings"]
    return findings + file_findings(ctx, refresh, REDEPLOY)


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
    # "vfio": the install lines that claim the VMs' functions for vfio-pci at boot, the
    # initramfs hook that adds vfio-pci there, and the boot unit for built-in/early drivers
    files = [f for f in ctx.plan.files.values() if f.concern in ("modules", "vfio")]
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
