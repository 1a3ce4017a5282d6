"""The kernel's views of the simulated state: /proc/modules, /proc/devices (with this boot's
dynamic majors), /sys/module, driver links in /sys/bus/pci, /proc/driver/nvidia, /dev/nvidia*."""

from __future__ import annotations

import json
import os

from . import sysfs_ctl
from .catalog import (
    DEFAULT_BLOCK,
    DEFAULT_CHAR,
    DYNAMIC_MAJORS,
    IN_TREE,
    NVIDIA_ADDRS,
    NVIDIA_PARAMS,
    NVIDIA_SIZES,
)
from .kofile import gcc_release, ko_info
from .machine import Machine, gpu_uuid, mknod, remove_tree
from .rm import RM_FILE, rm_text

PERSISTENCED_RUN = "run/nvidia-persistenced"  # /var/run links to /run on Debian


class KernelViews(Machine):
    """Writes what the kernel shows of the state (a part of Hw)."""

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
        import random  # here: only /proc views that vary per boot need it

        rng = random.Random(f"{self.state.get('boot_id', '')}/{name}")
        free = [m for m in DYNAMIC_MAJORS if m not in used and m != previous.get(name)]
        majors[name] = rng.choice(free[:12])  # the high end of the range, where the kernel looks
        return majors[name]

    def char_base(self) -> list[str]:
        return self.profile.get("char_devices") or DEFAULT_CHAR

    def write_views(self) -> None:
        self.write_proc_modules()
        self.write_proc_devices()
        self.write_sys_modules()
        # a driver's probe makes its own entries (/proc/driver/nvidia/gpus/<bdf>) before the
        # driver core links the device to it (really_probe, then driver_bound)
        self.write_driver_nvidia()
        self.write_bindings()
        self.write_rm()
        self.write_dev_nodes()

    def write_rm(self) -> None:
        """The stand-in libcuda's view of the driver (hwsim/rm.py), beside /proc/driver/nvidia."""
        text = rm_text(self)  # type: ignore[arg-type]  # self is an Hw: views mix into it
        if text is None:
            self.p(RM_FILE).unlink(missing_ok=True)
        else:
            self.write(RM_FILE, text, 0o444)

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
                import shutil

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
            for ctl in ("bind", "unbind"):
                sysfs_ctl.make(ddir / ctl, bool(self.state.get("live_sysfs")))
            for ctl in ("new_id", "remove_id"):
                if not (ddir / ctl).exists():
                    (ddir / ctl).write_text("")
            os.symlink(os.path.relpath(ddir, devdir), link)
            os.symlink(os.path.relpath(devdir, ddir), ddir / bdf)

    def nvidia_minors(self) -> dict[str, int]:
        """Each nvidia GPU's device minor, as the driver numbers them: a GPU takes the first
        free minor when nvidia probes it and frees it when it is removed (add_device and
        remove_device on nv_minor_num_table, kernel-open/nvidia/nv-frontend.c in
        NVIDIA/open-gpu-kernel-modules). So at module load the GPUs get 0..n-1 in probe (PCI)
        order, and a GPU moved away and back live gets the lowest free minor, while the others
        keep theirs. The table lives in the state; the module's load and unload clear it."""
        bindings = self.state.get("bindings", {})
        table: dict[str, int] = self.state.setdefault("nvidia_minors", {})
        for bdf in [b for b in table if bindings.get(b) != "nvidia"]:
            del table[bdf]  # remove_device: unbound, its minor is free again
        for gpu in sorted(self.gpus(), key=lambda g: g["bdf"]):
            if bindings.get(gpu["bdf"]) == "nvidia" and gpu["bdf"] not in table:
                used = set(table.values())
                table[gpu["bdf"]] = next(i for i in range(255) if i not in used)
        return table

    def nvidia_gpus(self) -> list[dict]:
        """GPUs bound to nvidia, in PCI order, each with its device minor."""
        bindings = self.state.get("bindings", {})
        minors = self.nvidia_minors()
        out = []
        for gpu in sorted(self.gpus(), key=lambda g: g["bdf"]):
            if bindings.get(gpu["bdf"]) == "nvidia":
                minor = minors[gpu["bdf"]]
                out.append(
                    dict(
                        gpu,
                        persistence_mode=self.persistence(gpu["bdf"], minor, gpu),
                        minor=minor,
                        uuid=gpu_uuid(gpu),
                        failed=self.state.get("gpu_failed", {}).get(gpu["bdf"]),
                    )
                )
        return out

    def persistence(self, bdf: str, minor: int, gpu: dict) -> bool:
        """Persistence mode of a GPU: on while nvidia-persistenced holds its node open (its
        held.json, written by the twin's stand-in daemon), or as `nvidia-smi -pm` set it
        without the daemon (the legacy, deprecated kernel-side mode), else the profile's."""
        legacy = self.state.get("persistence", {})
        if bdf in legacy:
            return bool(legacy[bdf])
        run = self.p(PERSISTENCED_RUN)
        try:
            pid = int((run / "nvidia-persistenced.pid").read_text())
            os.kill(pid, 0)
            held = json.loads((run / "held.json").read_text())
        except (OSError, ValueError):
            return bool(gpu["persistence_mode"])
        return minor in held

    def write_driver_nvidia(self) -> None:
        for d in ("proc/driver/nvidia", "proc/driver/nvidia-caps", "proc/driver/nvidia-uvm"):
            remove_tree(self.p(d))
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
        for name, (minor, mode) in CAP_FILES.items():  # nv-caps.c nv_cap_procfs_show
            self.write(
                f"proc/driver/nvidia/capabilities/{name}",
                f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n",
                0o444,
            )
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
        """/dev as a module load leaves it: the nvidia driver registers its majors but creates no
        node (devtmpfs gets none); nodes come only from nvidia-modprobe (make_nodes), and stay
        until the next boot, like mknod'ed files on a real /dev."""
        self.p("dev").mkdir(parents=True, exist_ok=True)

    def make_gpu_nodes(self, minors: list[int]) -> bool:
        """nvidia-modprobe -c N: /dev/nvidiaN for each live minor, and /dev/nvidiactl."""
        present = {g["minor"] for g in self.nvidia_gpus()}
        dev = self.p("dev")
        for minor in minors:
            if minor in present:
                mknod(dev / f"nvidia{minor}", 195, minor, 0o666)
        mknod(dev / "nvidiactl", 195, 255, 0o666)
        return all(m in present for m in minors)

    def make_cap_node(self, proc_file: str) -> bool:
        """nvidia-modprobe -f <capability proc file>: /dev/nvidia-caps/nvidia-capN from its
        DeviceFileMinor/DeviceFileMode, with this boot's nvidia-caps major."""
        path = self.p(proc_file)
        if not path.is_file() or not self.loaded("nvidia"):
            return False
        fields = dict(line.split(":", 1) for line in path.read_text().splitlines() if ":" in line)
        try:
            minor, mode = int(fields["DeviceFileMinor"]), int(fields["DeviceFileMode"])
        except (KeyError, ValueError):
            return False
        caps = self.p("dev/nvidia-caps")
        caps.mkdir(parents=True, exist_ok=True)
        os.chmod(caps, 0o755)
        mknod(caps / f"nvidia-cap{minor}", self.state["majors"]["nvidia-caps"], minor, mode)
        return True

    def make_uvm_nodes(self) -> None:
        major = self.state["majors"]["nvidia-uvm"]
        mknod(self.p("dev/nvidia-uvm"), major, 0, 0o666)
        mknod(self.p("dev/nvidia-uvm-tools"), major, 1, 0o666)


# The driver's capability files and (minor, DeviceFileMode) of their nodes: config 0400 (256),
# monitor 0444 (292), as nvidia-modprobe -f makes them on an H200 host.
CAP_FILES = {"mig/config": (1, 256), "mig/monitor": (2, 292)}
