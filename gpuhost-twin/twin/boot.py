"""Simulated (re)boot of a twin: derive the running machine from what the deploy wrote.

``simulate_boot(root, profile)`` runs at every (re)boot, outside the chroot, before sshd comes
back. It picks the kernel, builds /proc/cmdline, lays out /proc, /sys and /dev, loads modules
like systemd-modules-load and udev coldplug would, and records everything in
/var/lib/gpuhost-twin/hw.json (twin/hwsim/__init__.py lists the files).

The boot configuration snapshot and the kernel choice: kernel_choice.py; modules at boot
(initramfs, modules-load, udev coldplug, binding): boot_modules.py.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from twin import hwsim, kernel_direct
from twin.boot_modules import _load_modules
from twin.kernel_choice import BOOTCFG, BrickedError, choose_kernel, read_default_grub
from twin.profile import Profile

Hook = Callable[[Path], None]


def simulate_boot(
    root: Path,
    profile: Profile,
    early_hook: Hook | None = None,
    late_hook: Hook | None = None,
    live_sysfs: bool = False,
) -> None:
    """Boot the twin at root. early_hook runs before any module loads (plumbing: early units).
    live_sysfs: the PCI control files become FIFOs (hwsim/sysfs_ctl.py), for a twin whose
    supervisor applies what is written to them."""
    root = Path(root)
    write_profile(root, profile)
    for node in [*root.glob("dev/nvidia*"), root / "dev/vfio"]:  # devtmpfs starts empty
        if node.is_dir() and not node.is_symlink():
            shutil.rmtree(node)
        elif node.exists() or node.is_symlink():
            node.unlink()
    hw = hwsim.Hw(root)
    prev = hw.state
    hw.state = {
        "boot_count": prev.get("boot_count", 0) + 1,
        "boot_id": hwsim.new_boot_id(),
        "booted_at": time.time(),
        "uptime_at_boot": round(random.uniform(4.0, 7.0), 2),
        "previous_majors": prev.get("majors", {}),
        "previous_kernel": prev.get("kernel"),
        "dmesg": [],
        "live_sysfs": live_sysfs,
    }
    hw.p(hwsim.DMESG).unlink(missing_ok=True)
    direct = profile.boot.loader == "none"  # the hypervisor's kernel, no loader's choice
    kernel, cmdline, attempts = (kernel_direct.choose if direct else choose_kernel)(hw, profile)
    hw.state.update(kernel=kernel, cmdline=cmdline, boot_attempts=attempts)
    # The journal's previous boot (journalctl -b -1 -k): a boot that panicked just before this
    # one, else the last boot that came up (Debian 12 keeps the journal on disk).
    hw.state["previous_boot_log"] = hw.state.pop("panic_log", None) or prev.get("dmesg", [])
    _platform(hw, profile)
    _write_proc(hw, profile)
    hwsim.layout_pci(hw)
    _iommu_units(hw, profile)
    for f in ("sys/devices/system", "sys/module"):
        hw.p(f).mkdir(parents=True, exist_ok=True)
    hw.save()
    if early_hook:
        early_hook(root)
    _load_modules(hw)
    hw.state["p2p_dma_safe"] = not hw.state["sev_snp_active"]
    hw.state["boot_done"] = True
    hw.write_views()
    hw.save()
    # proxmox-boot-cleanup.service: only a boot that reaches userspace drops a --next-boot pin
    from twin import pve

    pve.on_boot(root)
    if late_hook:
        late_hook(root)


def write_profile(root: Path, profile: Profile) -> None:
    target = root / hwsim.PROFILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(profile.model_dump_json(by_alias=True, indent=1) + "\n")


# -- platform: IOMMU, SNP, groups -------------------------------------------------------------------
# drivers/iommu/amd/init.c parse_amd_iommu_options (6.8-6.14)
AMD_IOMMU_OPTIONS = {
    "fullflush",
    "force_enable",
    "off",
    "force_isolation",
    "pgtbl_v1",
    "pgtbl_v2",
    "irtcachedis",
    "nohugepages",
    "v2_pgsizes_only",
}


def _platform(hw: hwsim.Hw, profile: Profile) -> None:
    params = hw.state["cmdline"].split()
    keys = {p.partition("=")[0]: p.partition("=")[2] for p in params}
    unknown = []
    if profile.cpu.vendor == "Intel":  # intel_iommu_setup(): on/off among comma-separated options
        words = keys.get("intel_iommu", "").split(",")
        iommu = "on" in words or (profile.quirks.intel_iommu_default_on and "off" not in words)
        iommu = iommu and "off" not in words
    else:  # parse_amd_iommu_options(): "on" is no option; unknown ones are logged and ignored
        words = [w for w in keys.get("amd_iommu", "").split(",") if w]
        iommu = "off" not in words
        unknown = [w for w in words if w not in AMD_IOMMU_OPTIONS]
    iommu = iommu and keys.get("iommu") != "off"
    identity = keys.get("iommu") == "pt" or keys.get("iommu.passthrough") in ("1", "on", "y")
    domain = "identity" if identity else ("DMA" if keys.get("iommu.strict") == "1" else "DMA-FQ")
    # Only a kernel with Proxmox's ACS patch knows the parameter (hwsim/storage.py).
    acs_patch = hwsim.storage.kernel_has_acs_override(hw.root, hw.kernel)
    acs = acs_patch and "downstream" in keys.get("pcie_acs_override", "")
    groups = {}
    for dev in profile.pci_devices:
        if iommu and dev.iommu_group is not None:
            split = dev.acs_override_group if acs and dev.acs_override_group is not None else None
            groups[dev.bdf] = split if split is not None else dev.iommu_group
    snp = profile.quirks.sev_snp and iommu and not identity
    hw.state.update(
        iommu=iommu,
        iommu_domain=domain,
        acs_override=acs,
        groups=groups,
        sev_snp_active=snp,
        sev_snp_firmware=profile.quirks.sev_snp,
        # zfs-load-module.service loads zfs at every boot of a PVE host; pools import with it
        zfs_loaded=hwsim.storage.kernel_has_zfs(hw.root, hw.kernel),
    )
    kinfo = hw.kernel_info(hw.kernel)
    hw.klog(
        f"Linux version {hw.kernel} ({kinfo['builder']}) ({kinfo['gcc']}, {kinfo['ld']}) {kinfo['build']}"
    )
    hw.klog(f"Command line: {hw.state['cmdline']}")
    for attempt in hw.state["boot_attempts"][:-1]:
        hw.klog(f"twin: kernel {attempt['kernel']} {attempt['result']}")
    hw.klog(f"Kernel command line: {hw.state['cmdline']}")
    for line in profile.dmesg:
        hw.klog(line)
    for word in unknown:
        hw.klog(f"AMD-Vi: Unknown option - '{word}'")
    if "pcie_acs_override" in keys and not acs_patch:  # init/main.c: unknown parameters
        hw.klog(
            'Unknown kernel command line parameters "pcie_acs_override='
            f'{keys["pcie_acs_override"]}", will be passed to user space.'
        )
    if profile.quirks.sev_snp and not snp:
        # amd_iommu refuses SNP when the IOMMU is off or in passthrough (identity) mode.
        hw.klog(
            "AMD-Vi: SNP: IOMMU disabled or configured in passthrough mode, SNP cannot be supported."
        )
    if snp:
        hw.klog("SEV-SNP: RMP table physical range [0x0000001000000000 - 0x000000107fffffff]")
        hw.klog("AMD-Vi: IOMMU SNP support enabled.")
    if iommu and profile.cpu.vendor == "Intel":
        hw.klog("DMAR: IOMMU enabled")
    if acs:
        hw.klog(
            "Warning: PCIe ACS overrides enabled; This may allow non-IOMMU protected peer-to-peer DMA"
        )
    shown = "Passthrough (set via kernel command line)" if identity else "Translated"
    hw.klog(f"iommu: Default domain type: {shown}")
    if not identity:
        hw.klog("iommu: DMA domain TLB invalidation policy: lazy mode")


def _iommu_units(hw: hwsim.Hw, profile: Profile) -> None:
    """/sys/class/iommu/<unit>: one per IOMMU unit while the IOMMU is on (ivhdN / dmarN)."""
    top = hw.p("sys/class/iommu")
    shutil.rmtree(top, ignore_errors=True)
    top.mkdir(parents=True)
    if not hw.state["iommu"]:
        return
    prefix = "dmar" if profile.cpu.vendor == "Intel" else "ivhd"
    roots = sorted({d.bdf.rsplit(":", 1)[0] for d in profile.pci_devices})  # one per segment:bus
    for n in range(max(1, min(len(roots), 4))):
        unit = hw.p(f"sys/devices/virtual/iommu/{prefix}{n}")
        unit.mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../devices/virtual/iommu/{prefix}{n}", top / f"{prefix}{n}")


def _write_proc(hw: hwsim.Hw, profile: Profile) -> None:
    kinfo = hw.kernel_info(hw.kernel)
    hw.write("proc/cmdline", hw.state["cmdline"] + "\n", 0o444)
    hw.write(
        "proc/version",
        f"Linux version {hw.kernel} ({kinfo['builder']}) ({kinfo['gcc']},"
        f" {kinfo['ld']}) {kinfo['build']}\n",
        0o444,
    )
    hw.write("proc/sys/kernel/random/boot_id", hw.state["boot_id"] + "\n", 0o444)
    hw.write("proc/sys/kernel/osrelease", hw.kernel + "\n", 0o444)
    for name, value in panic_settings(hw.state["cmdline"].split()).items():
        hw.write(f"proc/sys/kernel/{name}", f"{value}\n", 0o644)  # live: sysctl writes them
    up = hw.state["uptime_at_boot"]
    hw.write("proc/uptime", f"{up:.2f} {up * 0.9 * profile.cpu.cpus:.2f}\n", 0o444)
    kib = profile.memory_gib * 1024 * 1024
    hw.write(
        "proc/meminfo",
        f"MemTotal:       {kib} kB\nMemFree:        {kib * 98 // 100} kB\n"
        f"MemAvailable:   {kib * 97 // 100} kB\n",
        0o444,
    )
    if not hw.p("proc/cpuinfo").exists():
        hw.write("proc/cpuinfo", cpuinfo(profile), 0o444)
    _numa(hw, profile)


def panic_settings(cmdline: list[str]) -> dict[str, int]:
    """/proc/sys/kernel's panic settings as the boot parameters leave them (kernel.rst;
    kernel-parameters.txt: oops=panic, softlockup_panic=, nmi_watchdog=panic, hung_task_panic=,
    panic=); the last occurrence wins. Debian's and Proxmox's kernels default them to 0."""
    values = dict.fromkeys(
        ("panic", "panic_on_oops", "softlockup_panic", "hardlockup_panic", "hung_task_panic"), 0
    )
    names = {"oops": "panic_on_oops", "nmi_watchdog": "hardlockup_panic"}
    for param in cmdline:
        key, _, value = param.partition("=")
        if key in ("oops", "nmi_watchdog"):
            values[names[key]] = int(value == "panic")
        elif (
            key in ("panic", "softlockup_panic", "hung_task_panic") and value.lstrip("-").isdigit()
        ):
            values[key] = int(value)
    return values


def cpuinfo(profile: Profile) -> str:
    cpu = profile.cpu
    flags = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx"
    flags += " fxsr sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc nopl xtopology"
    flags += " svm" if cpu.vendor == "AMD" else " vmx"
    if profile.quirks.sev_snp:
        flags += " sev sev_es sev_snp"
    per_node = cpu.cpus // cpu.numa_nodes
    text = ""
    for n in range(cpu.cpus):
        text += (
            f"processor\t: {n}\nvendor_id\t: {cpu.vendor_id}\nmodel name\t: {cpu.model_name}\n"
            f"physical id\t: {min(n // per_node, cpu.sockets - 1)}\nflags\t\t: {flags}\n\n"
        )
    return text


def _numa(hw: hwsim.Hw, profile: Profile) -> None:
    nodes = profile.cpu.numa_nodes
    shutil.rmtree(hw.p("sys/devices/system/node"), ignore_errors=True)
    span = "0" if nodes == 1 else f"0-{nodes - 1}"
    for name in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        hw.write(f"sys/devices/system/node/{name}", span + "\n", 0o444)
    hw.write("sys/devices/system/node/has_generic_initiator", "\n", 0o444)
    hw.write("sys/devices/system/node/uevent", "", 0o644)
    hw.p("sys/devices/system/node/power").mkdir()
    per = profile.cpu.cpus // nodes
    for n in range(nodes):
        hw.write(
            f"sys/devices/system/node/node{n}/cpulist", f"{n * per}-{(n + 1) * per - 1}\n", 0o444
        )
    hw.write("sys/devices/system/cpu/online", f"0-{profile.cpu.cpus - 1}\n", 0o444)


def refresh_uptime(root: Path) -> None:
    """Keep /proc/uptime growing between boots (pyinfra's reboot waits for it to drop)."""
    hwsim.refresh_uptime(root)


__all__ = ["BOOTCFG", "BrickedError", "read_default_grub", "refresh_uptime", "simulate_boot"]
