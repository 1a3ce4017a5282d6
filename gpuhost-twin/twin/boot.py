"""Simulated (re)boot of a twin: derive the running machine from what the deploy wrote.

``simulate_boot(root, profile)`` runs at every (re)boot, outside the chroot, before sshd comes
back. It picks the kernel, builds /proc/cmdline, lays out /proc, /sys and /dev, loads modules
like systemd-modules-load and udev coldplug would, and records everything in
/var/lib/gpuhost-twin/hw.json (twin/hwsim.py lists the files).

Boot configuration snapshot: /var/lib/gpuhost-twin/bootcfg.json
----------------------------------------------------------------
A real bootloader boots what the last `proxmox-boot-tool refresh` / `update-grub` wrote, not what
/etc says now. The Proxmox tool shims record that snapshot whenever they run; its format:

    {
      "loader": "systemd-boot" | "grub",
      "cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on",
                 # the options of the boot entry: /etc/kernel/cmdline (systemd-boot), or for grub
                 # "root=<dev> ro $GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT"
      "kernel_default": "6.8.12-9-pve" | null,   # pinned/default entry; null = newest of "kernels"
      "kernel_next": "6.14.8-2-bpo12-pve" | null, # one-shot entry (kernel pin --next-boot)
      "kernels": ["6.8.12-9-pve", "6.14.8-2-bpo12-pve"],  # kernels with boot entries
      "entries": {"6.8.12-9-pve": "root=..."},   # optional: options per kernel entry
      "initrd": {"6.8.12-9-pve": {"files": {...}}},  # optional: initramfs synced to the ESP
      "written_by": "proxmox-boot-tool refresh", "written_at": 1764439200.0
    }

Boot consumes "kernel_next" (rewrites the file with null) and deletes /etc/kernel/next-boot-pin,
like the firmware's one-shot entry plus proxmox-boot-cleanup.service. Without the snapshot the
config files are read directly: /etc/kernel/{next-boot-pin,proxmox-boot-pin,cmdline} for
systemd-boot; /etc/default/grub + /etc/default/grub.d/*.cfg (GRUB_DEFAULT from
proxmox-kernel-pin.cfg) for GRUB; else the newest /boot/vmlinuz-*.

A kernel in the profile's failing_kernels "hangs": the twin power-cycles into the default entry
(recorded in hw.json "boot_attempts"); if that hangs too the host is bricked (BrickedError).

Modules at boot, in order:
1. initramfs: the modules of /etc/initramfs-tools/modules, with the modprobe.d options, as the
   initramfs recorded them when update-initramfs last ran (the Proxmox shims write the image as
   JSON {"files": {path: text}}; ESP hosts boot the copy synced at the last refresh, bootcfg
   "initrd"), so a change without update-initramfs (and refresh) does not reach early boot;
2. modules-load: modules-load=... on the command line, /usr/lib|/lib|/etc/modules-load.d/*.conf,
   /etc/modules;
3. udev coldplug per device in BDF order: driver_override from udev rules
   (KERNEL=="<bdf>" ... ATTR{driver_override}="...") and the ``early_hook``; modalias autoload
   (nouveau unless blacklisted — it binds none of these GPUs —, nvidia when its .ko exists);
   built-in device drivers of the profile (pcieport, nvme, snd_hda_intel...).
Binding follows the kernel: driver_override decides; else vfio-pci takes its ids=, nvidia takes
NVIDIA display-class functions. /dev/nvidia-uvm* appear only through nvidia-modprobe -u.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from twin import hwsim
from twin.profile import Profile

BOOTCFG = "var/lib/gpuhost-twin/bootcfg.json"
Hook = Callable[[Path], None]


class BrickedError(RuntimeError):
    """Every kernel the bootloader would try hangs: the real host would not come back."""


def simulate_boot(
    root: Path, profile: Profile, early_hook: Hook | None = None, late_hook: Hook | None = None
) -> None:
    """Boot the twin at root. early_hook runs before any module loads (plumbing: early units)."""
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
    }
    hw.p(hwsim.DMESG).unlink(missing_ok=True)
    kernel, cmdline, attempts = choose_kernel(hw, profile)
    hw.state.update(kernel=kernel, cmdline=cmdline, boot_attempts=attempts)
    _platform(hw, profile)
    _write_proc(hw, profile)
    hwsim.layout_pci(hw)
    for f in ("sys/devices/system", "sys/module"):
        hw.p(f).mkdir(parents=True, exist_ok=True)
    hw.save()
    if early_hook:
        early_hook(root)
    _udev_overrides(hw)
    _load_modules(hw)
    hw.state["p2p_dma_safe"] = not hw.state["sev_snp_active"]
    hw.state["boot_done"] = True
    hw.write_views()
    hw.save()
    if late_hook:
        late_hook(root)


def write_profile(root: Path, profile: Profile) -> None:
    target = root / hwsim.PROFILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(profile.model_dump_json(by_alias=True, indent=1) + "\n")


# -- kernel and command line ----------------------------------------------------------------------
def choose_kernel(hw: hwsim.Hw, profile: Profile) -> tuple[str, str, list[dict]]:
    installed = hw.installed_kernels()
    if not installed:
        raise BrickedError("no kernel image in /boot: the bootloader has nothing to boot")
    cfg = _bootcfg(hw, profile, installed)
    entries = [k for k in cfg["kernels"] if k in installed] or installed
    default = cfg["kernel_default"] if cfg["kernel_default"] in entries else entries[-1]
    first = cfg["kernel_next"] if cfg["kernel_next"] in entries else default
    _consume_next_boot(hw)
    attempts = []
    for kernel in dict.fromkeys([first, default]):
        if kernel in profile.failing_kernels:
            attempts.append({"kernel": kernel, "result": "hung at boot; power-cycled"})
            continue
        attempts.append({"kernel": kernel, "result": "booted"})
        options = cfg["entries"].get(kernel) or cfg["cmdline"]
        return kernel, _full_cmdline(profile, kernel, options), attempts
    raise BrickedError(
        f"kernel {first} hangs at boot and the default entry {default} does too: host bricked"
    )


def _bootcfg(hw: hwsim.Hw, profile: Profile, installed: list[str]) -> dict:
    path = hw.p(BOOTCFG)
    if path.exists():
        cfg = json.loads(path.read_text())
        return {
            "cmdline": cfg.get("cmdline", ""),
            "kernel_default": cfg.get("kernel_default"),
            "kernel_next": cfg.get("kernel_next"),
            "kernels": cfg.get("kernels") or installed,
            "entries": cfg.get("entries") or {},  # options per kernel, when the writer gives them
        }
    next_pin = _first_line(hw.p("etc/kernel/next-boot-pin"))
    pin = _first_line(hw.p("etc/kernel/proxmox-boot-pin"))
    if profile.boot.loader == "systemd-boot":
        cmdline = _first_line(hw.p("etc/kernel/cmdline")) or ""
    else:
        grub = read_default_grub(hw.root)
        m = re.search(r">gnulinux-(\S+?)-advanced-|with Linux (\S+)", grub.get("GRUB_DEFAULT", ""))
        pin = (m.group(1) or m.group(2)) if m else pin
        cmdline = " ".join(
            [
                "root=/dev/mapper/pve-root",
                "ro",
                grub.get("GRUB_CMDLINE_LINUX", ""),
                grub.get("GRUB_CMDLINE_LINUX_DEFAULT", ""),
            ]
        )
    return {
        "cmdline": cmdline,
        "kernel_default": pin,
        "kernel_next": next_pin,
        "kernels": installed,
        "entries": {},
    }


def _consume_next_boot(hw: hwsim.Hw) -> None:
    hw.p("etc/kernel/next-boot-pin").unlink(missing_ok=True)
    path = hw.p(BOOTCFG)
    if path.exists():
        cfg = json.loads(path.read_text())
        if cfg.get("kernel_next"):
            cfg["kernel_next"] = None
            hw.write(BOOTCFG, json.dumps(cfg, indent=1, sort_keys=True) + "\n")


def _full_cmdline(profile: Profile, kernel: str, options: str) -> str:
    """What the loader hands the kernel: systemd-boot adds initrd=, GRUB adds BOOT_IMAGE=."""
    if profile.boot.loader == "systemd-boot":
        head = f"initrd=\\EFI\\proxmox\\{kernel}\\initrd.img-{kernel}"
    else:
        head = f"BOOT_IMAGE=/boot/vmlinuz-{kernel}"
    return " ".join([head, *options.split()])


def read_default_grub(root: Path) -> dict[str, str]:
    """/etc/default/grub then /etc/default/grub.d/*.cfg as shell assignments ($VAR expanded)."""
    values: dict[str, str] = {}
    files = [root / "etc/default/grub", *sorted((root / "etc/default/grub.d").glob("*.cfg"))]
    for f in files:
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            m = re.match(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
            if not m:
                continue
            raw = m.group(2).strip()
            if raw.startswith("'") and raw.endswith("'"):
                values[m.group(1)] = raw[1:-1]
                continue
            raw = raw[1:-1] if raw.startswith('"') and raw.endswith('"') else raw
            values[m.group(1)] = re.sub(
                r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda v: values.get(v.group(1), ""), raw
            )
    return values


def _first_line(path: Path) -> str | None:
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    return lines[0].strip() if lines and lines[0].strip() else None


# -- platform: IOMMU, SNP, groups -------------------------------------------------------------------
def _platform(hw: hwsim.Hw, profile: Profile) -> None:
    params = hw.state["cmdline"].split()
    keys = {p.partition("=")[0]: p.partition("=")[2] for p in params}
    if profile.cpu.vendor == "Intel":
        iommu = keys.get("intel_iommu", "").startswith("on")
    else:
        iommu = keys.get("amd_iommu") != "off"
    iommu = iommu and keys.get("iommu") != "off"
    identity = keys.get("iommu") == "pt" or keys.get("iommu.passthrough") in ("1", "on", "y")
    domain = "identity" if identity else ("DMA" if keys.get("iommu.strict") == "1" else "DMA-FQ")
    acs = "downstream" in keys.get("pcie_acs_override", "")
    groups = {}
    for dev in profile.pci_devices:
        if iommu and dev.iommu_group is not None:
            split = dev.acs_override_group if acs and dev.acs_override_group is not None else None
            groups[dev.bdf] = split if split is not None else dev.iommu_group
    snp = profile.quirks.sev_snp and iommu and not identity
    hw.state.update(
        iommu=iommu, iommu_domain=domain, acs_override=acs, groups=groups, sev_snp_active=snp
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


# -- modules --------------------------------------------------------------------------------------
def _udev_overrides(hw: hwsim.Hw) -> None:
    """driver_override set by udev rules at device add: KERNEL=="<bdf>" ... ATTR{driver_override}."""
    files: dict[str, Path] = {}
    for d in ("lib/udev/rules.d", "usr/lib/udev/rules.d", "etc/udev/rules.d"):
        for f in sorted(hw.p(d).glob("*.rules")) if hw.p(d).is_dir() else []:
            files[f.name] = f
    for name in sorted(files):
        for line in files[name].read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            bdf = re.search(r'KERNELS?=="([0-9a-f:.]+)"', line)
            value = re.search(r'ATTR\{driver_override\}="([^"]*)"', line)
            if bdf and value and bdf.group(1) in hw.devices():
                hw.write(
                    f"sys/bus/pci/devices/{bdf.group(1)}/driver_override", value.group(1) + "\n"
                )


def _names(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        words = line.split("#", 1)[0].strip()
        if words and not words.startswith(";"):
            out.append(words.split())
    return out


def _load_modules(hw: hwsim.Hw) -> None:
    conf = hw.modprobe_conf()
    kver = hw.kernel
    # 1. initramfs: its own copy of the module configuration, as of update-initramfs
    record = _initramfs(hw, kver)
    if record is not None:
        files = record.get("files", {})
        early_conf = hw.modprobe_conf(
            {
                k: v
                for k, v in files.items()
                if k.startswith("/etc/modprobe.d/") and k.endswith(".conf")
            }
        )
        for line in files.get("/etc/initramfs-tools/modules", "").splitlines():
            words = line.split("#", 1)[0].split()
            if words:
                _load(hw, words[0], words[1:], early_conf)
    # 2. modules-load
    for word in hw.state["cmdline"].split():
        if word.startswith("modules-load="):
            for name in word.split("=", 1)[1].split(","):
                _load(hw, name, [], conf)
    loads: dict[str, Path] = {}
    for d in ("usr/lib/modules-load.d", "lib/modules-load.d", "etc/modules-load.d"):
        for f in sorted(hw.p(d).glob("*.conf")) if hw.p(d).is_dir() else []:
            loads[f.name] = f
    if "modules.conf" not in loads:
        loads["modules.conf"] = hw.p("etc/modules")  # Debian links it there
    for name in sorted(loads):
        for words in _names(loads[name]):
            _load(hw, words[0], words[1:], conf)
    # 3. udev coldplug
    kvm = "kvm_amd" if hw.profile["cpu"]["vendor"] == "AMD" else "kvm_intel"
    _load(hw, kvm, [], conf)
    for bdf, dev in sorted(hw.devices().items()):
        if hw.state["bindings"].get(bdf):
            continue
        override = hw.driver_override(bdf)
        if dev["vendor"] == "10de" and dev["class"].startswith("03"):
            for alias in ("nouveau", "nvidia"):
                if alias not in conf["blacklist"] and hw.module_exists(alias):
                    _load(hw, alias, [], conf)
        elif dev.get("driver") and override in (None, dev["driver"]):
            hw.bind_all(dev["driver"])
    if not hw.loaded("nvidia") and "nvidia" not in hw.state:
        ko = hw.find_ko("nvidia")
        why = (
            "nothing loaded it (blacklisted, or no alias match)"
            if ko
            else f"no nvidia.ko for {kver}"
        )
        hw.state["nvidia"] = {"loaded": False, "reason": why}


def _initramfs(hw: hwsim.Hw, kver: str) -> dict | None:
    """The initramfs the loader hands this kernel: the ESP copy recorded at the last refresh
    (bootcfg "initrd"), else /boot/initrd.img-<kver>; a JSON record of the module configuration
    written by the twin's update-initramfs ({"files": {path: text}}). Anything else (a real
    image, or none) contributes no early modules; "initramfs" in hw.json says which it was."""
    data: object = None
    cfg_path = hw.p(BOOTCFG)
    synced = json.loads(cfg_path.read_text()).get("initrd") if cfg_path.exists() else None
    if isinstance(synced, dict):
        data = synced.get(kver)
        hw.state["initramfs"] = "esp" if data else "missing on the ESP"
    else:
        image = hw.p(f"boot/initrd.img-{kver}")
        try:
            data = json.loads(image.read_text())
            hw.state["initramfs"] = "/boot"
        except (OSError, ValueError):
            hw.state["initramfs"] = "none" if not image.exists() else "opaque image"
    return data if isinstance(data, dict) else None


def _load(hw: hwsim.Hw, name: str, params: list[str], conf: dict) -> None:
    ok, message = hw.load(name, params, conf)
    if not ok:
        for line in message.splitlines():
            hw.klog(f"systemd-modules-load: {line}")


def refresh_uptime(root: Path) -> None:
    """Keep /proc/uptime growing between boots (pyinfra's reboot waits for it to drop)."""
    hwsim.refresh_uptime(root)


__all__ = ["BrickedError", "read_default_grub", "refresh_uptime", "simulate_boot"]
