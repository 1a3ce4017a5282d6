"""Why a host needs a boot, read off what it shows, and which kernel that boot would start.

Reasons come from the running host (its command line, live module parameters, the loaded
driver, each GPU's binding), never from what a run changed, so a run killed anywhere still
reboots on the next one when the host needs it, and a converged host is never rebooted.
"""

from __future__ import annotations

import re

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.model import REBOOT_NOW, GpuAssignment, Reason
from gpuhost.spec.host import HostSpec


def kernel_version_key(release: str) -> tuple[int, ...]:
    """Order kernel releases as proxmox-boot-tool does (version sort on the numbers)."""
    return tuple(int(n) for n in re.findall(r"\d+", release))


def next_boot_kernel(facts: HostFacts) -> str | None:
    """The kernel a reboot starts now: the next-boot pin, the pin, else the newest installed."""
    kernels = facts.boot_kernels
    if kernels is None:
        return None
    if kernels.next_boot or kernels.pinned:
        return kernels.next_boot or kernels.pinned
    return max(kernels.all, key=kernel_version_key, default=None)


def reboot_reasons(
    spec: HostSpec,
    facts: HostFacts,
    add: list[str],
    remove: list[str],
    blacklist: list[str],
    modules_load: dict[str, list[str]],
    expected_parameters: dict[str, dict[str, str]],
    assignments: list[GpuAssignment],
) -> list[Reason]:
    """Why the host needs a boot, from what it shows now (never from what a run changed)."""
    kernel = facts.kernel
    reasons: list[Reason] = []
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
    # Every planned parameter, of any module: a loaded module keeps what it was loaded with.
    for module, parameters in expected_parameters.items():
        loaded = live.get(module, {})
        for name, value in parameters.items():
            if name in loaded and loaded[name] != value:
                text = f"{module} {name} is {loaded[name]}, must be {value} (module reload)"
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
    return reasons


def pin_running_kernel(
    facts: HostFacts,
    next_kernel: str | None,
    reasons: list[Reason],
    problems: list[str],
    notes: list[str],
) -> bool:
    """Never reboot into a kernel this run did not choose: an apt upgrade may have installed a
    newer one, which would boot without a matching nvidia module. Pin the running one first."""
    if not any(r.concern in REBOOT_NOW for r in reasons):
        return False
    running = facts.kernel.release
    if facts.boot_kernels is None:
        notes.append(
            "the kernel the next boot starts is not known without proxmox-boot-tool; make sure "
            f"the boot loader's default entry is the running kernel {running}"
        )
        return False
    if next_kernel is None or next_kernel == running:
        return False
    if running not in facts.boot_kernels.all:
        problems.append(
            f"a reboot would start kernel {next_kernel}, not the running {running}, which "
            f"proxmox-boot-tool does not list, so gpuhost cannot pin it; add it (proxmox-boot-tool "
            f"kernel add {running}) or make {next_kernel} the kernel you want"
        )
        return False
    notes.append(
        f"a reboot would start kernel {next_kernel}, not the running {running}: the deploy pins "
        f"{running} first (proxmox-boot-tool kernel pin)"
    )
    return True
