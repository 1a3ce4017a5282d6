"""The twin's simulated hardware, stdlib only: it runs outside the twin (boot) and inside it (shims).

Copied into the twin as /usr/lib/gpuhost-twin/twin_hwsim.py. Every path is under a root prefix
(``Hw(root)``; the shims take it from $TWIN_ROOT, default "/"), so tests run it on a temp dir.

Files it owns under the root:
    /etc/gpuhost-twin/profile.json     the hardware profile (twin/profile.py, dumped by alias)
    /var/lib/gpuhost-twin/hw.json      live state: booted kernel, cmdline, loaded modules and their
                                       parameters, majors, per-BDF binding, why nvidia did not load
    /var/log/twin-dmesg                the kernel log of this boot (dmesg-style lines)
    /proc/{cmdline,version,modules,devices,uptime,meminfo,cpuinfo,driver/nvidia/...}
    /proc/sys/kernel/random/boot_id
    /sys/{bus/pci,devices/pci*,kernel/iommu_groups,module,devices/system/node}
    /dev/nvidia*, /dev/nvidia-caps/*   real character device nodes (mknod)

Module loading rules (the twin's kernel): an out-of-tree module (nvidia*) loads only from a real
.ko under /lib/modules/<booted>/ (updates/ first, like depmod's default search order) whose
vermagic equals the booted kernel's and whose .comment GCC release equals the one that built the
kernel (Debian revisions are ignored: 12.2.0-14 and 12.2.0-14+deb12u1 are one toolchain); nvidia
also needs /lib/firmware/nvidia/<version>/gsp_*.bin. In-tree modules come from IN_TREE.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import stat
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

PROFILE = "etc/gpuhost-twin/profile.json"
STATE = "var/lib/gpuhost-twin/hw.json"
DMESG = "var/log/twin-dmesg"

# In-tree modules of the simulated Proxmox kernel: path under /lib/modules/<ver>/, dependencies,
# /sys/module parameters (defaults) and core size.
IN_TREE: dict[str, dict] = {
    "vfio": {
        "path": "kernel/drivers/vfio/vfio.ko",
        "deps": [],
        "params": {"enable_unsafe_noiommu_mode": "N"},
        "size": 69632,
        "desc": "VFIO - User Level meta-driver",
    },
    "vfio_iommu_type1": {
        "path": "kernel/drivers/vfio/vfio_iommu_type1.ko",
        "deps": ["vfio"],
        "params": {
            "allow_unsafe_interrupts": "N",
            "disable_hugepages": "N",
            "dma_entry_limit": "65535",
        },
        "size": 49152,
        "desc": "Type1 IOMMU driver for VFIO",
    },
    "vfio_pci_core": {
        "path": "kernel/drivers/vfio/pci/vfio-pci-core.ko",
        "deps": ["vfio", "irqbypass"],
        "params": {"disable_idle_d3": "N", "disable_vga": "N", "nointxmask": "N"},
        "size": 86016,
        "desc": "core driver for VFIO based PCI devices",
    },
    "vfio_pci": {
        "path": "kernel/drivers/vfio/pci/vfio-pci.ko",
        "deps": ["vfio_pci_core"],
        "params": {"disable_denylist": "N", "enable_sriov": "N", "ids": ""},
        "size": 16384,
        "desc": "VFIO PCI - User Level meta-driver",
    },
    "irqbypass": {
        "path": "virt/lib/irqbypass.ko",
        "deps": [],
        "params": {},
        "size": 12288,
        "desc": "IRQ bypass manager utility module",
    },
    "kvm": {
        "path": "arch/x86/kvm/kvm.ko",
        "deps": ["irqbypass"],
        "params": {"halt_poll_ns": "200000", "nx_huge_pages": "N"},
        "size": 1384448,
        "desc": "",
    },
    "kvm_amd": {
        "path": "arch/x86/kvm/kvm-amd.ko",
        "deps": ["kvm"],
        "params": {"npt": "Y", "nested": "1", "sev": "Y", "sev_es": "Y", "sev_snp": "N"},
        "size": 208896,
        "desc": "",
    },
    "kvm_intel": {
        "path": "arch/x86/kvm/kvm-intel.ko",
        "deps": ["kvm"],
        "params": {"nested": "Y", "ept": "Y"},
        "size": 417792,
        "desc": "",
    },
    "nouveau": {
        "path": "kernel/drivers/gpu/drm/nouveau/nouveau.ko",
        "deps": [],
        "params": {"modeset": "-1"},
        "size": 3112960,
        "desc": "nVidia Riva/TNT/GeForce/Quadro/Tesla/Tegra K1+",
    },
}
# Dependencies among NVIDIA's modules (the real .ko files carry them in depends=).
NVIDIA_DEPS = {
    "nvidia_uvm": ["nvidia"],
    "nvidia_modeset": ["nvidia"],
    "nvidia_drm": ["nvidia_modeset"],
    "nvidia_peermem": ["nvidia"],
}
# Core sizes of the real modules, from the h200x2 capture (proc_modules.out); the twin's tiny .ko
# stands in for code, not for size.
NVIDIA_SIZES = {"nvidia": 14299136, "nvidia_uvm": 1830912, "nvidia_modeset": 1597440}
NVIDIA_ADDRS = {"nvidia": 0xFFFFFFFFC0400000, "nvidia_uvm": 0xFFFFFFFFC080C000}

# /sys/module/nvidia_uvm/parameters as captured on the H200 hosts (driver 580.159.04).
UVM_PARAMS = {
    "uvm_ats_mode": "1",
    "uvm_block_cpu_to_cpu_copy_with_ce": "0",
    "uvm_channel_gpfifo_loc": "auto",
    "uvm_channel_gpput_loc": "auto",
    "uvm_channel_num_gpfifo_entries": "1024",
    "uvm_channel_pushbuffer_loc": "auto",
    "uvm_conf_computing_channel_iv_rotation_limit": "2147483648",
    "uvm_cpu_chunk_allocation_sizes": "2166784",
    "uvm_debug_enable_push_acquire_info": "0",
    "uvm_debug_enable_push_desc": "0",
    "uvm_debug_prints": "0",
    "uvm_disable_hmm": "N",
    "uvm_downgrade_force_membar_sys": "1",
    "uvm_enable_builtin_tests": "0",
    "uvm_enable_debug_procfs": "0",
    "uvm_enable_va_space_mm": "1",
    "uvm_exp_gpu_cache_peermem": "0",
    "uvm_exp_gpu_cache_sysmem": "0",
    "uvm_fault_force_sysmem": "0",
    "uvm_force_prefetch_fault_support": "0",
    "uvm_global_oversubscription": "1",
    "uvm_leak_checker": "0",
    "uvm_page_table_location": "(null)",
    "uvm_peer_copy": "phys",
    "uvm_perf_access_counter_batch_count": "256",
    "uvm_perf_access_counter_migration_enable": "-1",
    "uvm_perf_access_counter_threshold": "256",
    "uvm_perf_fault_batch_count": "256",
    "uvm_perf_fault_coalesce": "1",
    "uvm_perf_fault_max_batches_per_service": "20",
    "uvm_perf_fault_max_throttle_per_service": "5",
    "uvm_perf_fault_replay_policy": "2",
    "uvm_perf_fault_replay_update_put_ratio": "50",
    "uvm_perf_map_remote_on_eviction": "1",
    "uvm_perf_map_remote_on_native_atomics_fault": "0",
    "uvm_perf_migrate_cpu_preunmap_block_order": "2",
    "uvm_perf_migrate_cpu_preunmap_enable": "1",
    "uvm_perf_pma_batch_nonpinned_order": "6",
    "uvm_perf_prefetch_enable": "1",
    "uvm_perf_prefetch_min_faults": "1",
    "uvm_perf_prefetch_threshold": "51",
    "uvm_perf_reenable_prefetch_faults_lapse_msec": "1000",
    "uvm_perf_thrashing_enable": "1",
    "uvm_perf_thrashing_epoch": "2000",
    "uvm_perf_thrashing_lapse_usec": "500",
    "uvm_perf_thrashing_max_resets": "4",
    "uvm_perf_thrashing_nap": "1",
    "uvm_perf_thrashing_pin": "300",
    "uvm_perf_thrashing_pin_threshold": "10",
    "uvm_perf_thrashing_threshold": "3",
    "uvm_release_asserts": "1",
    "uvm_release_asserts_dump_stack": "0",
    "uvm_release_asserts_set_global_error": "0",
}
# /proc/driver/nvidia/params as captured (580.159.04); NVreg_<Key>=v options change the values.
NVIDIA_PARAMS = [
    ("ResmanDebugLevel", "4294967295"),
    ("RmLogonRC", "1"),
    ("ModifyDeviceFiles", "1"),
    ("DeviceFileUID", "0"),
    ("DeviceFileGID", "0"),
    ("DeviceFileMode", "438"),
    ("InitializeSystemMemoryAllocations", "1"),
    ("UsePageAttributeTable", "4294967295"),
    ("EnableMSI", "1"),
    ("EnablePCIeGen3", "0"),
    ("MemoryPoolSize", "0"),
    ("KMallocHeapMaxSize", "0"),
    ("VMallocHeapMaxSize", "0"),
    ("IgnoreMMIOCheck", "0"),
    ("EnableStreamMemOPs", "0"),
    ("EnableUserNUMAManagement", "1"),
    ("NvLinkDisable", "0"),
    ("RmProfilingAdminOnly", "0"),
    ("PreserveVideoMemoryAllocations", "0"),
    ("EnableS0ixPowerManagement", "0"),
    ("S0ixPowerManagementVideoMemoryThreshold", "256"),
    ("DynamicPowerManagement", "3"),
    ("DynamicPowerManagementVideoMemoryThreshold", "200"),
    ("RegisterPCIDriver", "1"),
    ("EnablePCIERelaxedOrderingMode", "0"),
    ("EnableResizableBar", "0"),
    ("EnableGpuFirmware", "18"),
    ("EnableGpuFirmwareLogs", "2"),
    ("RmNvlinkBandwidthLinkCount", "0"),
    ("EnableDbgBreakpoint", "0"),
    ("OpenRmEnableUnsupportedGpus", "1"),
    ("DmaRemapPeerMmio", "1"),
    ("ImexChannelCount", "2048"),
    ("CreateImexChannel0", "0"),
    ("GrdmaPciTopoCheckOverride", "0"),
    ("CoherentGPUMemoryMode", '""'),
    ("RegistryDwords", '""'),
    ("RegistryDwordsPerDevice", '""'),
    ("RmMsg", '""'),
    ("GpuBlacklist", '""'),
    ("TemporaryFilePath", '""'),
    ("ExcludedGpus", '""'),
]
# Proxmox-like /proc/devices for profiles that do not give their own (constructed).
# fmt: off
DEFAULT_CHAR = [
    "1 mem", "4 /dev/vc/0", "4 tty", "4 ttyS", "5 /dev/tty", "5 /dev/console", "5 /dev/ptmx",
    "5 ttyprintk", "7 vcs", "10 misc", "13 input", "21 sg", "29 fb", "89 i2c", "108 ppp",
    "128 ptm", "136 pts", "180 usb", "188 ttyUSB", "189 usb_device", "202 cpu/msr",
    "203 cpu/cpuid", "226 drm", "243 ipmidev", "244 hidraw", "245 ttyDBC", "246 bsg",
    "247 watchdog", "248 remoteproc", "249 ptp", "250 pps", "251 rtc", "252 dax", "253 tpm",
    "254 gpiochip",
]
DEFAULT_BLOCK = [
    "7 loop", "8 sd", "9 md", "11 sr", "65 sd", "66 sd", "67 sd", "68 sd", "69 sd", "70 sd",
    "71 sd", "128 sd", "129 sd", "130 sd", "131 sd", "132 sd", "133 sd", "134 sd", "135 sd",
    "230 zvol", "252 device-mapper", "253 virtblk", "254 mdp", "259 blkext",
]
# fmt: on
DYNAMIC_MAJORS = list(range(254, 233, -1)) + list(range(511, 383, -1))
BRIDGE_DRIVER = "pcieport"
VENDORS = {
    "10de": "NVIDIA Corporation",
    "1022": "Advanced Micro Devices, Inc. [AMD]",
    "8086": "Intel Corporation",
    "1af4": "Red Hat, Inc.",
    "144d": "Samsung Electronics Co Ltd",
    "14e4": "Broadcom Inc. and subsidiaries",
    "1a03": "ASPEED Technology, Inc.",
    "10b5": "PLX Technology, Inc.",
    "1000": "Broadcom / LSI",
    "15b3": "Mellanox Technologies",
}


def norm(name: str) -> str:
    """Module names: '-' and '_' are one (vfio-pci == vfio_pci)."""
    return name.replace("-", "_")


def gcc_release(text: str) -> str | None:
    """'gcc (Debian 12.2.0-14) 12.2.0' or 'GCC: (GCC) 15.3.0' -> '12.2.0' / '15.3.0'."""
    found = re.findall(r"(\d+\.\d+\.\d+)\s*$", text.strip())
    return found[-1] if found else None


def gpu_uuid(gpu: dict) -> str:
    if gpu.get("uuid"):
        return gpu["uuid"]
    h = hashlib.sha256(gpu["uuid_seed"].encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def read_elf_sections(path: Path, names: tuple[str, ...] = (".modinfo", ".comment")) -> dict:
    """Raw bytes of the named sections of a real ELF64 .ko (no readelf needed in the twin)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path}: not an ELF64 object")
    (e_shoff,) = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [
        struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)
    ]
    strtab = headers[e_shstrndx]
    out = {}
    for h in headers:
        start = strtab[4] + h[0]
        name = data[start : data.index(b"\0", start)].decode()
        if name in names:
            out[name] = data[h[4] : h[4] + h[5]]
    return out


def ko_info(path: Path) -> dict:
    """modinfo-like fields of a real .ko plus 'comment' (the .comment GCC line)."""
    sections = read_elf_sections(path)
    info: dict[str, str] = {}
    for item in sections.get(".modinfo", b"").split(b"\0"):
        if b"=" in item:
            key, _, value = item.decode(errors="replace").partition("=")
            info.setdefault(key, value)
    comments = [c.decode() for c in sections.get(".comment", b"").split(b"\0") if c.strip()]
    info["comment"] = comments[0] if comments else ""
    return info


class Hw:
    """The simulated machine under one root; load state, change it, save it."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root if root is not None else os.environ.get("TWIN_ROOT", "/"))
        self.profile: dict = json.loads(self.p(PROFILE).read_text())
        path = self.p(STATE)
        self.state: dict = json.loads(path.read_text()) if path.exists() else {}

    # -- paths and small helpers ------------------------------------------------------------
    def p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        target = self.p(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)

    def save(self) -> None:
        self.write(STATE, json.dumps(self.state, indent=1, sort_keys=True) + "\n")

    def klog(self, message: str) -> None:
        """Append a kernel log line, stamped with simulated seconds since boot."""
        t = max(time.time() - self.state.get("booted_at", time.time()), 0.0) if self.state else 0.0
        if self.state.get("boot_done"):  # at runtime: seconds since the simulated power-on
            t += self.state.get("uptime_at_boot", 0.0)
        line = f"[{t:12.6f}] {message}"
        self.state.setdefault("dmesg", []).append(line)
        target = self.p(DMESG)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as f:
            f.write(line + "\n")

    @property
    def kernel(self) -> str:
        return self.state.get("kernel", "")

    def devices(self) -> dict[str, dict]:
        return {d["bdf"]: d for d in self.profile["pci_devices"]}

    def gpus(self) -> list[dict]:
        return self.profile["gpus"]

    def modules(self) -> dict[str, dict]:
        return self.state.setdefault("modules", {})

    def loaded(self, name: str) -> bool:
        return norm(name) in self.modules()

    # -- kernels -----------------------------------------------------------------------------
    def kernel_info(self, version: str) -> dict:
        """How a kernel was built: profile entry, else /boot/config-<ver> (CONFIG_CC_VERSION_TEXT)."""
        for k in self.profile["kernels"]:
            if k["version"] == version:
                info = dict(k)
                break
        else:
            info = {
                "version": version,
                "gcc": "",
                "ld": "GNU ld (GNU Binutils for Debian) 2.40",
                "builder": "build@proxmox",
                "build": None,
            }
            record = self.p(f"lib/modules/{version}/twin-kernel.json")
            config = self.p(f"boot/config-{version}")
            if record.exists():  # written by hardware.add_kernel for kernels added later
                info.update(json.loads(record.read_text()))
            elif config.exists():
                m = re.search(r'^CONFIG_CC_VERSION_TEXT="(.*)"$', config.read_text(), re.M)
                info["gcc"] = m.group(1) if m else ""
        if not info.get("build"):
            stamp = re.sub(r"-pve$", "", version)
            info["build"] = f"#1 SMP PREEMPT_DYNAMIC PMX {stamp} (2025-03-16T19:18Z)"
        info["vermagic"] = f"{version} SMP preempt mod_unload modversions"
        return info

    def installed_kernels(self) -> list[str]:
        boot = self.p("boot")
        found = [f.name[len("vmlinuz-") :] for f in boot.glob("vmlinuz-*")] if boot.is_dir() else []
        return sorted(found, key=version_key)

    # -- modprobe configuration ---------------------------------------------------------------
    def modprobe_conf(self, texts: dict[str, str] | None = None) -> dict:
        """options/blacklist/softdep/install from modprobe.d (+ the kernel command line).

        texts: {path: content} of modprobe.d files to use instead of the root's (an initramfs).
        """
        if texts is None:
            texts = {}
            for d in ("lib/modprobe.d", "usr/lib/modprobe.d", "run/modprobe.d", "etc/modprobe.d"):
                for f in sorted(self.p(d).glob("*.conf")) if self.p(d).is_dir() else []:
                    texts[f"/{d}/{f.name}"] = f.read_text(errors="replace")
        files: dict[str, str] = {}
        for path, text in texts.items():  # later directories override same-named files, like kmod
            files[path.rsplit("/", 1)[-1]] = text
        conf: dict = {"options": {}, "blacklist": set(), "softdep": {}, "install": {}}
        for name in sorted(files):
            text = files[name].replace("\\\n", " ")
            for raw in text.splitlines():
                words = raw.split("#", 1)[0].split()
                if len(words) < 2:
                    continue
                verb, mod = words[0], norm(words[1])
                if verb == "options":
                    conf["options"].setdefault(mod, []).extend(words[2:])
                elif verb == "blacklist":
                    conf["blacklist"].add(mod)
                elif verb == "install":
                    conf["install"][mod] = " ".join(words[2:])
                elif verb == "softdep":
                    pre, post, where = [], [], None
                    for w in words[2:]:
                        if w in ("pre:", "post:"):
                            where = pre if w == "pre:" else post
                        elif where is not None:
                            where.append(norm(w))
                    old = conf["softdep"].get(mod, ([], []))
                    conf["softdep"][mod] = (old[0] + pre, old[1] + post)
        for word in self.state.get("cmdline", "").split():
            key, _, value = word.partition("=")
            if key == "modprobe.blacklist":
                conf["blacklist"].update(norm(m) for m in value.split(","))
            elif "." in key and value and not key.startswith(("iommu", "pci")):
                mod, _, param = key.partition(".")
                conf["options"].setdefault(norm(mod), []).append(f"{param}={value}")
        return conf

    # -- finding modules -----------------------------------------------------------------------
    def find_ko(self, name: str, kver: str | None = None) -> Path | None:
        """A real .ko for name under /lib/modules/<kver> (updates/ > extra/ > the rest)."""
        base = self.p(f"lib/modules/{kver or self.kernel}")
        if not base.is_dir():
            return None
        hits = [f for f in base.rglob("*.ko") if norm(f.stem) == norm(name)]
        order = ("updates", "extra")

        def rank(f: Path) -> tuple[int, str]:
            top = f.relative_to(base).parts[0]
            return (order.index(top) if top in order else len(order), str(f))

        return min(hits, key=rank) if hits else None

    def module_exists(self, name: str, kver: str | None = None) -> bool:
        kver = kver or self.kernel
        return (norm(name) in IN_TREE and self.p(f"lib/modules/{kver}").is_dir()) or bool(
            self.find_ko(name, kver)
        )

    # -- loading -----------------------------------------------------------------------------
    def load(
        self,
        name: str,
        params: list[str] | None = None,
        conf: dict | None = None,
        _stack: tuple[str, ...] = (),
    ) -> tuple[bool, str]:
        """modprobe <name> [params]: (ok, modprobe-style error). Updates state, not the views."""
        name = norm(name)
        conf = conf if conf is not None else self.modprobe_conf()
        if self.loaded(name) or name in _stack:
            return True, ""
        install = conf["install"].get(name)
        if install and install.split()[0] in ("/bin/false", "/usr/bin/false", "false"):
            return False, (
                "modprobe: ERROR: ../libkmod/libkmod-module.c:1013 command_do() Error running"
                f" install command '{install}' for module {name}: retcode 1\n"
                f"modprobe: ERROR: could not insert '{name}': Invalid argument"
            )
        kver = self.kernel
        ko = None if name in IN_TREE else self.find_ko(name)
        if name not in IN_TREE and ko is None:
            return (
                False,
                f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{kver}",
            )
        if name in IN_TREE and not self.p(f"lib/modules/{kver}").is_dir():
            return (
                False,
                f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{kver}",
            )
        pre, post = conf["softdep"].get(name, ([], []))
        for dep in pre:
            self.load(dep, None, conf, (*_stack, name))
        info = ko_info(ko) if ko else {}
        deps = IN_TREE[name]["deps"] if name in IN_TREE else list(NVIDIA_DEPS.get(name, []))
        deps += [norm(d) for d in info.get("depends", "").split(",") if d and norm(d) not in deps]
        for dep in deps:
            ok, err = self.load(dep, None, conf, (*_stack, name))
            if not ok:
                return False, err
        if ko is not None:
            refused = self._refuse(name, ko, info)
            if refused:
                return False, refused
        values = dict(IN_TREE[name]["params"]) if name in IN_TREE else {}
        if name == "nvidia_uvm":
            values = dict(UVM_PARAMS)
        given = conf["options"].get(name, []) + list(params or [])
        for word in given:
            key, _, value = word.partition("=")
            if key in values or name == "nvidia":
                values[key] = _param_value(values.get(key, ""), value)
            else:
                self.klog(f"{name}: unknown parameter '{key}' ignored")
        record = {
            "path": str(ko.relative_to(self.root)) if ko else IN_TREE[name]["path"],
            "params": values,
            "deps": deps,
            "version": info.get("version", ""),
            "license": info.get("license", "GPL"),
            "intree": ko is None,
        }
        if ko is not None and not self.state.get("tainted"):  # the kernel says it once
            self.state["tainted"] = True
            self.klog(f"{name}: loading out-of-tree module taints kernel.")
            self.klog(
                f"{name}: module verification failed: signature and/or required key missing"
                " - tainting kernel"
            )
        self.modules()[name] = record
        ok, err = self._on_load(name, record)
        if not ok:
            del self.modules()[name]
            return False, err
        for dep in post:
            self.load(dep, None, conf, (*_stack, name))
        return True, ""

    def _refuse(self, name: str, ko: Path, info: dict) -> str:
        """Why the kernel refuses this real .ko, as modprobe would print it; '' if it loads."""
        kinfo = self.kernel_info(self.kernel)
        why = ""
        if info.get("vermagic", "").split() != kinfo["vermagic"].split():
            self.klog(
                f"{name}: version magic '{info.get('vermagic', '')}' should be"
                f" '{kinfo['vermagic']} '"
            )
            why = f"vermagic {info.get('vermagic', '').strip()!r} != {kinfo['vermagic']!r}"
            err = "Exec format error"
        elif gcc_release(info["comment"]) != gcc_release(kinfo["gcc"]):
            # A real kernel would not say it; the host bricked instead (domain.md). The twin
            # refuses loudly so the toolchain rule is testable.
            self.klog(
                f"{name}: twin: module built by {info['comment'] or 'an unknown compiler'} but"
                f" the kernel by {kinfo['gcc']}; refusing mismatched toolchain"
            )
            why = f"GCC {gcc_release(info['comment'])} != kernel GCC {gcc_release(kinfo['gcc'])}"
            err = "Exec format error"
        elif name == "nvidia" and not self._gsp_firmware(info.get("version", "")):
            self.klog("NVRM: RmFetchGspRmImages: No firmware image found")
            self.klog(
                f"NVRM: request_firmware failed for nvidia/{info.get('version', '')}/gsp_*.bin"
            )
            self.klog("NVRM: None of the NVIDIA devices were initialized.")
            why = f"no GSP firmware /lib/firmware/nvidia/{info.get('version', '')}/gsp_*.bin"
            err = "No such device"
        else:
            return ""
        if name == "nvidia":
            self.state["nvidia"] = {
                "loaded": False,
                "reason": why,
                "ko": str(ko.relative_to(self.root)),
            }
        return f"modprobe: ERROR: could not insert '{name}': {err}"

    def _gsp_firmware(self, version: str) -> bool:
        fw = self.p(f"lib/firmware/nvidia/{version}")
        return fw.is_dir() and any(fw.glob("gsp_*.bin"))

    def _on_load(self, name: str, record: dict) -> tuple[bool, str]:
        if name == "nvidia":
            return self._load_nvidia(record)
        if name == "nvidia_uvm":
            self.major("nvidia-uvm")
        if name == "vfio_pci":
            ids = record["params"].get("ids", "")
            self.bind_all("vfio-pci", ids=[i for i in ids.split(",") if i])
        if name == "kvm_amd" and self.state.get("sev_snp_active"):
            record["params"]["sev_snp"] = "Y"
        return True, ""

    def _load_nvidia(self, record: dict) -> tuple[bool, str]:
        version = record["version"]
        self.klog(
            f"nvidia-nvlink: Nvlink Core is being initialized, major device number"
            f" {self.profile['nvidia']['fixed_majors'].get('nvidia-nvlink', 240)}"
        )
        open_module = "MIT" in record["license"]
        flavour = (
            "NVIDIA UNIX Open Kernel Module for x86_64"
            if open_module
            else ("NVIDIA UNIX x86_64 Kernel Module")
        )
        self.klog(
            f"NVRM: loading {flavour}  {version}  Release Build  {self.profile['nvidia']['build_tag']}"
        )
        self.state["nvidia"] = {
            "loaded": True,
            "reason": "",
            "version": version,
            "open": open_module,
            "ko": record["path"],
        }
        bound = self.bind_all("nvidia")
        if not bound and not any(b == "nvidia" for b in self.state.get("bindings", {}).values()):
            self.klog("NVRM: No NVIDIA GPU found.")
            self.state["nvidia"] = {
                "loaded": False,
                "reason": "no GPU left for nvidia (all bound elsewhere)",
                "ko": record["path"],
            }
            return False, "modprobe: ERROR: could not insert 'nvidia': No such device"
        self.major("nvidia-caps")
        if any(g["persistence_mode"] for g in self.gpus()):
            self.klog(
                "NVRM: Persistence mode is deprecated and will be removed in a future release."
                " Please use nvidia-persistenced instead."
            )
        return True, ""

    def unload(self, name: str) -> tuple[bool, str]:
        name = norm(name)
        if not self.loaded(name):
            return True, ""
        users = [m for m, r in self.modules().items() if name in r["deps"]]
        if users:
            return False, f"modprobe: FATAL: Module {name} is in use."
        del self.modules()[name]
        driver = {"nvidia": "nvidia", "vfio_pci": "vfio-pci"}.get(name)
        if driver:
            for bdf, drv in list(self.state.get("bindings", {}).items()):
                if drv == driver:
                    self.state["bindings"][bdf] = None
        if name == "nvidia":
            self.state["nvidia"] = {"loaded": False, "reason": "unloaded (modprobe -r)"}
        return True, ""

    # -- binding -----------------------------------------------------------------------------
    def driver_override(self, bdf: str) -> str | None:
        f = self.p(f"sys/bus/pci/devices/{bdf}/driver_override")
        value = f.read_text().strip() if f.exists() else "(null)"
        return None if value in ("", "(null)") else value

    def bind_all(self, driver: str, ids: list[str] | None = None) -> list[str]:
        """Probe every unbound device the driver may take (driver_override first, like the kernel)."""
        bindings = self.state.setdefault("bindings", {})
        bound = []
        for bdf, dev in sorted(self.devices().items()):
            if bindings.get(bdf):
                continue
            override = self.driver_override(bdf)
            if override is not None:
                wants = override == driver
            elif driver == "nvidia":
                wants = dev["vendor"] == "10de" and dev["class"].startswith("03")
            elif driver == "vfio-pci":
                wants = f"{dev['vendor']}:{dev['device']}" in (ids or [])
            else:
                wants = dev.get("driver") == driver
            if not wants:
                continue
            if driver == "vfio-pci" and not self._group_of(bdf):
                self.klog(f"vfio-pci: probe of {bdf} failed with error -22")
                continue
            if driver == "nvidia" and not self._nvidia_probe(bdf, dev):
                continue
            bindings[bdf] = driver
            bound.append(bdf)
        return bound

    def _nvidia_probe(self, bdf: str, dev: dict) -> bool:
        gpu = next((g for g in self.gpus() if g["bdf"] == bdf), None)
        if gpu is None:
            return False
        if gpu["architecture"] == "Blackwell" and not self.state["nvidia"].get("open"):
            self.klog(
                f"NVRM: The NVIDIA GPU {bdf} (PCI ID: {dev['vendor']}:{dev['device']})\n"
                "NVRM: installed in this system requires use of the NVIDIA open kernel modules."
            )
            return False
        failed = self.state.setdefault("gpu_failed", {})
        failed.pop(bdf, None)
        if gpu.get("fsp_fails_on_identity") and self.group_type(bdf) == "identity":
            # The device stays bound (probe succeeds); RM init fails, so NVML cannot see it.
            self.klog(f"NVRM: GPU {bdf}: kfspWaitForSecureBoot_GH100: FSP boot failed, error 0x177")
            self.klog(f"NVRM: GPU {bdf}: RmInitAdapter failed! (0x62:0x177:2131)")
            failed[bdf] = "FSP boot failed (error 0x177) under an identity IOMMU domain"
        return True

    def _group_of(self, bdf: str) -> int | None:
        return self.state.get("groups", {}).get(bdf)

    def group_type(self, bdf: str) -> str | None:
        group = self._group_of(bdf)
        if group is None:
            return None
        f = self.p(f"sys/kernel/iommu_groups/{group}/type")
        return f.read_text().strip() if f.exists() else self.state.get("iommu_domain")

    # -- majors --------------------------------------------------------------------------------
    def major(self, name: str) -> int:
        """This boot's dynamic major for name, never the previous boot's (like a reordered boot)."""
        majors = self.state.setdefault("majors", {})
        if name in majors:
            return majors[name]
        fixed = self.profile["nvidia"]["fixed_majors"]
        used = {int(line.split()[0]) for line in self.char_base()} | set(fixed.values())
        used |= set(majors.values()) | {195}
        previous = self.state.get("previous_majors", {})
        wanted = self.profile["nvidia"].get("first_boot_majors", {}).get(name)
        if self.state.get("boot_count", 1) == 1 and wanted and wanted not in used:
            majors[name] = wanted
            return wanted
        rng = random.Random(f"{self.state.get('boot_id', '')}/{name}")
        free = [m for m in DYNAMIC_MAJORS if m not in used and m != previous.get(name)]
        majors[name] = rng.choice(free[:12])  # the high end of the range, where the kernel looks
        return majors[name]

    def char_base(self) -> list[str]:
        return self.profile.get("char_devices") or DEFAULT_CHAR

    # -- views: /proc, /sys, /dev ---------------------------------------------------------------
    def write_views(self) -> None:
        self.write_proc_modules()
        self.write_proc_devices()
        self.write_sys_modules()
        self.write_bindings()
        self.write_driver_nvidia()
        self.write_dev_nodes()

    def write_proc_modules(self) -> None:
        lines = []
        addr = 0xFFFFFFFFC1000000
        for name, rec in reversed(list(self.modules().items())):  # newest first, like the kernel
            users = [m for m, r in self.modules().items() if name in r["deps"]]
            size = NVIDIA_SIZES.get(name) or IN_TREE.get(name, {}).get("size") or 16384
            at = NVIDIA_ADDRS.get(name, addr)
            addr += (size + 0xFFF) & ~0xFFF
            taint = "" if rec["intree"] else " (OE)"
            used = ",".join(users) + "," if users else "-"
            lines.append(f"{name} {size} {len(users)} {used} Live 0x{at:016x}{taint}")
        self.write("proc/modules", "".join(line + "\n" for line in lines), 0o444)

    def write_proc_devices(self) -> None:
        chars = [(int(m), n) for m, n in (line.split(None, 1) for line in self.char_base())]
        majors = self.state.get("majors", {})
        fixed = self.profile["nvidia"]["fixed_majors"]
        if self.loaded("nvidia"):
            chars += [(195, "nvidia"), (195, "nvidiactl"), (majors["nvidia-caps"], "nvidia-caps")]
            chars += [(m, n) for n, m in fixed.items()]
        if self.loaded("nvidia_uvm"):
            chars.append((majors["nvidia-uvm"], "nvidia-uvm"))
        chars.sort(key=lambda c: c[0])  # stable: same-major entries keep their order
        blocks = [
            line.split(None, 1) for line in self.profile.get("block_devices") or DEFAULT_BLOCK
        ]
        text = "Character devices:\n" + "".join(f"{m:3d} {n}\n" for m, n in chars)
        text += "\nBlock devices:\n" + "".join(f"{int(m):3d} {n}\n" for m, n in blocks)
        self.write("proc/devices", text, 0o444)

    def write_sys_modules(self) -> None:
        top = self.p("sys/module")
        for d in top.iterdir() if top.is_dir() else []:
            if d.name not in self.modules():
                shutil.rmtree(d)
        for name, rec in self.modules().items():
            d = f"sys/module/{name}"
            self.write(f"{d}/initstate", "live\n", 0o444)
            self.write(
                f"{d}/refcnt", f"{sum(name in r['deps'] for r in self.modules().values())}\n"
            )
            if rec["version"]:
                self.write(f"{d}/version", rec["version"] + "\n", 0o444)
            if not rec["intree"]:
                self.write(f"{d}/taint", "OE\n", 0o444)
            for key, value in rec["params"].items() if name != "nvidia" else []:
                # nvidia's NVreg_* parameters have mode 0: no files (module_params.out).
                self.write(f"{d}/parameters/{key}", f"{value}\n", 0o444)

    def write_bindings(self) -> None:
        drivers = self.p("sys/bus/pci/drivers")
        for d in drivers.iterdir() if drivers.is_dir() else []:
            for link in d.iterdir():
                if link.is_symlink():
                    link.unlink()
        bindings = self.state.get("bindings", {})
        for bdf in self.devices():
            devdir = self.p(self.state["sysfs_paths"][bdf])
            link = devdir / "driver"
            if link.is_symlink():
                link.unlink()
            driver = bindings.get(bdf)
            if not driver:
                continue
            ddir = drivers / driver
            ddir.mkdir(parents=True, exist_ok=True)
            for ctl in ("bind", "unbind", "new_id", "remove_id"):
                if not (ddir / ctl).exists():
                    (ddir / ctl).write_text("")
            os.symlink(os.path.relpath(ddir, devdir), link)
            os.symlink(os.path.relpath(devdir, ddir), ddir / bdf)

    def nvidia_gpus(self) -> list[dict]:
        """GPUs bound to nvidia, in PCI order, each with its device minor."""
        bindings = self.state.get("bindings", {})
        out = []
        for gpu in sorted(self.gpus(), key=lambda g: g["bdf"]):
            if bindings.get(gpu["bdf"]) == "nvidia":
                out.append(
                    dict(
                        gpu,
                        minor=len(out),
                        uuid=gpu_uuid(gpu),
                        failed=self.state.get("gpu_failed", {}).get(gpu["bdf"]),
                    )
                )
        return out

    def write_driver_nvidia(self) -> None:
        for d in ("proc/driver/nvidia", "proc/driver/nvidia-caps", "proc/driver/nvidia-uvm"):
            shutil.rmtree(self.p(d), ignore_errors=True)
        if not self.loaded("nvidia"):
            return
        nv = self.state["nvidia"]
        flavour = (
            "NVIDIA UNIX Open Kernel Module for x86_64"
            if nv.get("open")
            else "NVIDIA UNIX x86_64 Kernel Module"
        )
        ko = ko_info(self.p(nv["ko"]))
        gcc = gcc_release(ko["comment"]) or "unknown"
        distro = ko["comment"].split("(", 1)[1].rsplit(")", 1)[0] if "(" in ko["comment"] else ""
        self.write(
            "proc/driver/nvidia/version",
            f"NVRM version: {flavour}  {nv['version']}  Release Build  "
            f"{self.profile['nvidia']['build_tag']}\n"
            f"GCC version:  gcc version {gcc} ({distro}) \n",
            0o444,
        )
        overrides = {}
        for word in self.modules()["nvidia"]["params"]:
            if word.startswith("NVreg_"):
                overrides[word[len("NVreg_") :]] = self.modules()["nvidia"]["params"][word]
        lines = []
        for key, value in NVIDIA_PARAMS:
            if key == "NvLinkDisable" and not self.profile["nvidia"]["nvlink_links"]:
                value = "1"  # h200x1 capture: a lone GPU without NVLink peers reads 1
            lines.append(f"{key}: {overrides.get(key, value)}\n")
        self.write("proc/driver/nvidia/params", "".join(lines), 0o444)
        self.write("proc/driver/nvidia/registry", 'Binary: ""\n', 0o644)
        for name in ("suspend", "suspend_depth"):
            self.write(f"proc/driver/nvidia/{name}", "", 0o644)
        for name in ("patches/README", "warnings/README"):
            self.write(f"proc/driver/nvidia/{name}", "", 0o444)
        for name in ("mig-minors", "nvlink-minors", "sys-minors"):
            self.write(f"proc/driver/nvidia-caps/{name}", "", 0o444)
        self.write("proc/driver/nvidia/capabilities/fabric-imex-mgmt", "", 0o444)
        self.write("proc/driver/nvidia/capabilities/mig/config", "", 0o444)
        self.write("proc/driver/nvidia/capabilities/mig/monitor", "", 0o444)
        firmware = nv["version"] if self._gsp_firmware(nv["version"]) else "N/A"
        for gpu in self.nvidia_gpus():
            self.p(f"proc/driver/nvidia/capabilities/gpu{gpu['minor']}/mig").mkdir(parents=True)
            base = f"proc/driver/nvidia/gpus/{gpu['bdf']}"
            info = (
                f"Model: \t\t {gpu['name']}\n"
                f"IRQ:   \t\t {gpu['irq']}\n"
                f"GPU UUID: \t {gpu['uuid']}\n"
                f"Video BIOS: \t {gpu['vbios'].lower()}\n"
                "Bus Type: \t PCIe\n"
                f"DMA Size: \t {gpu['dma_bits']} bits\n"
                f"DMA Mask: \t 0x{(1 << gpu['dma_bits']) - 1:x}\n"
                f"Bus Location: \t {gpu['bdf']}\n"
                f"Device Minor: \t {gpu['minor']}\n"
                f"GPU Firmware: \t {firmware}\n"
                "GPU Excluded:\t No\n"
            )
            self.write(f"{base}/information", info, 0o444)
            self.write(f"{base}/power", "", 0o444)
            self.write(f"{base}/registry", "", 0o644)
        for d in ("proc/driver/nvidia", "proc/driver/nvidia-caps"):  # procfs dirs read dr-xr-xr-x
            for sub in [self.p(d), *[x for x in self.p(d).rglob("*") if x.is_dir()]]:
                os.chmod(sub, 0o555)

    def write_dev_nodes(self) -> None:
        """/dev/nvidia* as real char nodes; uvm nodes only via make_uvm_nodes (nvidia-modprobe -u)."""
        dev = self.p("dev")
        dev.mkdir(parents=True, exist_ok=True)
        for node in dev.glob("nvidia*"):
            if node.name.startswith("nvidia-uvm") and self.loaded("nvidia_uvm"):
                continue  # they stay while the module does (with this boot's major)
            shutil.rmtree(node) if node.is_dir() and not node.is_symlink() else node.unlink()
        if not self.loaded("nvidia"):
            return
        for gpu in self.nvidia_gpus():
            mknod(dev / f"nvidia{gpu['minor']}", 195, gpu["minor"], 0o666)
        mknod(dev / "nvidiactl", 195, 255, 0o666)
        caps = self.state["majors"]["nvidia-caps"]
        (dev / "nvidia-caps").mkdir(exist_ok=True)
        os.chmod(dev / "nvidia-caps", 0o755)
        mknod(dev / "nvidia-caps/nvidia-cap1", caps, 1, 0o400)
        mknod(dev / "nvidia-caps/nvidia-cap2", caps, 2, 0o444)

    def make_uvm_nodes(self) -> None:
        major = self.state["majors"]["nvidia-uvm"]
        mknod(self.p("dev/nvidia-uvm"), major, 0, 0o666)
        mknod(self.p("dev/nvidia-uvm-tools"), major, 1, 0o666)


@contextlib.contextmanager
def locked(root: str | Path | None = None) -> Iterator[None]:
    """Serialise state changes (two SSH sessions may run modprobe at once)."""
    base = Path(root if root is not None else os.environ.get("TWIN_ROOT", "/"))
    lock = base / "var/lib/gpuhost-twin/hw.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def mknod(path: Path, major: int, minor: int, mode: int) -> None:
    if path.exists() or path.is_symlink():
        st = path.lstat()
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor):
            os.chmod(path, mode)
            return
        path.unlink()
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # umask-proof


def _param_value(old: str, value: str) -> str:
    """Booleans read back as Y/N from /sys/module, like the kernel's param_get_bool."""
    if old in ("Y", "N"):
        return "Y" if value.lower() in ("1", "y", "yes", "on", "true") else "N"
    return value


def version_key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.-]", version))


def new_boot_id() -> str:
    return str(uuid.uuid4())


def sysfs_path(devices: dict[str, dict], bdf: str) -> str:
    """sys/devices/pci<dom>:<bus>/<upstream bridges...>/<bdf>, following parent links."""
    chain = [bdf]
    while devices[chain[-1]].get("parent"):
        chain.append(devices[chain[-1]]["parent"])
    chain.reverse()
    return f"sys/devices/pci{chain[0][:7]}/" + "/".join(chain)


def layout_pci(hw: Hw) -> None:
    """Fresh PCI sysfs: device dirs, bus links, IOMMU groups; bridges bound to pcieport."""
    for tree in ("sys/bus/pci", "sys/kernel/iommu_groups"):
        shutil.rmtree(hw.p(tree), ignore_errors=True)
    for top in hw.p("sys/devices").glob("pci*") if hw.p("sys/devices").is_dir() else []:
        shutil.rmtree(top)
    devices = hw.devices()
    groups = hw.state.get("groups", {})
    paths = {bdf: sysfs_path(devices, bdf) for bdf in devices}
    hw.state["sysfs_paths"] = paths
    bus_devices = hw.p("sys/bus/pci/devices")
    bus_devices.mkdir(parents=True)
    for ctl in ("drivers_probe", "rescan"):
        hw.write(f"sys/bus/pci/{ctl}", "", 0o200)
    bindings = hw.state.setdefault("bindings", {})
    for bdf, dev in sorted(devices.items()):
        d = paths[bdf]
        cls = dev["class"]
        modalias = (
            f"pci:v0000{dev['vendor']}d0000{dev['device']}sv0000{dev['subsystem_vendor']}"
            f"sd0000{dev['subsystem_device']}bc{cls[:2]}sc{cls[2:4]}i{cls[4:]}"
        ).upper()
        devdir = hw.p(d)
        devdir.mkdir(parents=True, exist_ok=True)
        for name, value in (
            ("vendor", f"0x{dev['vendor']}"),
            ("device", f"0x{dev['device']}"),
            ("class", f"0x{cls}"),
            ("subsystem_vendor", f"0x{dev['subsystem_vendor']}"),
            ("subsystem_device", f"0x{dev['subsystem_device']}"),
            ("revision", f"0x{dev['revision']}"),
            ("numa_node", str(dev["numa_node"])),
            ("irq", str(dev["irq"])),
            ("modalias", modalias.replace("PCI:", "pci:")),
            ("enable", "1"),
            ("driver_override", "(null)"),
        ):
            (devdir / name).write_text(value + "\n")  # a fresh tree: no need for atomic writes
        for ctl in ("remove", "rescan", "reset"):
            (devdir / ctl).write_text("")
        os.symlink(os.path.relpath(devdir, bus_devices), bus_devices / bdf)
        group = groups.get(bdf)
        if group is not None:
            gdir = hw.p(f"sys/kernel/iommu_groups/{group}")
            (gdir / "devices").mkdir(parents=True, exist_ok=True)
            if not (gdir / "type").exists():
                hw.write(f"sys/kernel/iommu_groups/{group}/type", hw.state["iommu_domain"] + "\n")
            os.symlink(os.path.relpath(gdir, devdir), devdir / "iommu_group")
            os.symlink(os.path.relpath(devdir, gdir / "devices"), gdir / "devices" / bdf)
        bindings[bdf] = BRIDGE_DRIVER if dev.get("driver") == BRIDGE_DRIVER else None


def apply_sysfs_writes(root: str | Path) -> bool:
    """Apply writes to the plain sysfs control files (see _apply_sysfs_writes), under the lock."""
    with locked(root):
        return _apply_sysfs_writes(Hw(root))


def _apply_sysfs_writes(hw: Hw) -> bool:
    """Apply what was written to the plain sysfs control files (bind/unbind/drivers_probe).

    The files are plain, so nothing reacts to a write by itself: the plumbing calls this after
    commands (or periodically); each control file is emptied once applied. True if anything changed.
    """
    changed = False
    drivers = hw.p("sys/bus/pci/drivers")
    bindings = hw.state.setdefault("bindings", {})
    requests: list[tuple[str, str, str]] = []
    for ddir in sorted(drivers.iterdir()) if drivers.is_dir() else []:
        for ctl in ("unbind", "bind"):
            f = ddir / ctl
            text = f.read_text() if f.exists() else ""
            requests += [(ctl, ddir.name, bdf) for bdf in text.split()]
            if text:
                f.write_text("")
    probe = hw.p("sys/bus/pci/drivers_probe")
    probes = probe.read_text().split() if probe.exists() else []
    if probes:
        probe.write_text("")
    for ctl, driver, bdf in requests:
        if bdf not in bindings:
            continue
        if ctl == "unbind" and bindings[bdf] == driver:
            bindings[bdf], changed = None, True
        elif ctl == "bind" and bindings[bdf] is None:
            override = hw.driver_override(bdf)
            if (override in (None, driver) and hw.loaded(norm(driver))) or driver == BRIDGE_DRIVER:
                bindings[bdf], changed = driver, True
    for bdf in probes:
        override = hw.driver_override(bdf)
        if bdf in bindings and bindings[bdf] is None and override and hw.loaded(norm(override)):
            bindings[bdf], changed = override, True
    if changed:
        hw.write_views()
        hw.save()
    return changed


def refresh_uptime(root: str | Path) -> None:
    """Rewrite /proc/uptime from the boot time; the plumbing calls this so uptime keeps growing."""
    hw = Hw(root)
    up = time.time() - hw.state["booted_at"] + hw.state.get("uptime_at_boot", 0.0)
    hw.write("proc/uptime", f"{up:.2f} {up * 0.9 * hw.profile['cpu']['cpus']:.2f}\n", 0o444)
