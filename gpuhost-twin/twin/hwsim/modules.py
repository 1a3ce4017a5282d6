"""Loading and unloading kernel modules (what modprobe asks of the kernel): softdeps and install
commands (from modprobe_conf.py), finding the .ko, the kernel's refusals (vermagic, toolchain, GSP
firmware), parameters, and what a load does (nvidia binds GPUs, vfio-pci takes its ids)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from . import sysfs_ctl
from .catalog import IN_TREE, NVIDIA_DEPS, UVM_PARAMS
from .kofile import gcc_release, ko_info, norm
from .machine import STATE
from .modprobe_conf import ModprobeConfig

# Runs a modprobe.d install command: (command, extra environment) -> (exit status, output).
InstallRunner = Callable[[str, dict[str, str]], tuple[int, str]]
BOOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class KernelModules(ModprobeConfig):
    """Module loading rules of the simulated kernel (a part of Hw).

    ``install_runner`` runs modprobe.d ``install`` commands for real (kmod's command_do:
    system(3), i.e. /bin/sh -c, with MODPROBE_MODULE set); the boot and the modprobe shim set
    one that fits where they run. The default runs /bin/sh chrooted into the root.
    """

    install_runner: InstallRunner | None = None

    def probe_plan(
        self, name: str, conf: dict, ignore_install: bool = False
    ) -> tuple[str | None, list[str], list[str]]:
        """What kmod does for ``modprobe name``: (the install command it runs instead, or None,
        and the pre and post softdeps it loads around the insert).

        Softdeps are the names kmod finds; "a,b" or a missing module drops out ("failed to
        lookup dependency, continuing anyway"). A module with softdeps has its install command
        ignored (libkmod-module.c: mod->ignorecmd = pre || post). --ignore-install covers the
        named module only, and kmod then loads none of its softdeps either
        (__kmod_module_get_probe_list with ignorecmd)."""
        name = norm(name)
        pre, post = ([], []) if ignore_install else conf["softdep"].get(name, ([], []))
        pre = [d for d in pre if self._resolves(d, conf)]
        post = [d for d in post if self._resolves(d, conf)]
        install = conf["install"].get(name)
        if install and not ignore_install and not (pre or post):
            return install, [], []
        return None, pre, post

    def _resolves(self, name: str, conf: dict) -> bool:
        """A softdep name kmod finds: a module, or a name only an install line defines."""
        return self.module_exists(name) or name in conf["install"]

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

    def in_tree(self, name: str, kver: str | None = None) -> bool:
        """An in-tree module of the kernel: it is in IN_TREE and the kernel has its module tree
        (modprobe(8) looks for modules in /lib/modules/<release> only; a kernel the profile says
        has none, twin-kernel.json's in_tree_modules, has no in-tree .ko to load)."""
        kver = kver or self.kernel
        if norm(name) not in IN_TREE or not self.p(f"lib/modules/{kver}").is_dir():
            return False
        cache = self.__dict__.setdefault("_in_tree_modules", {})
        if kver not in cache:
            record = self.p(f"lib/modules/{kver}/twin-kernel.json")
            data = json.loads(record.read_text()) if record.exists() else {}
            cache[kver] = data.get("in_tree_modules", True)
        return cache[kver]

    def module_exists(self, name: str, kver: str | None = None) -> bool:
        kver = kver or self.kernel
        return self.in_tree(name, kver) or bool(self.find_ko(name, kver))

    def load(
        self,
        name: str,
        params: list[str] | None = None,
        conf: dict | None = None,
        _stack: tuple[str, ...] = (),
        ignore_install: bool = False,
    ) -> tuple[bool, str]:
        """modprobe <name> [params]: (ok, modprobe-style error). Updates state, not the views."""
        name = norm(name)
        conf = conf if conf is not None else self.modprobe_conf()
        if self.loaded(name) or name in _stack:
            return True, ""
        if self.builtin(name):
            # kmod_module_probe_insert_module: a built-in module is there already (its
            # initstate is "builtin"): success, and no install command runs
            return True, ""
        install, pre, post = self.probe_plan(name, conf, ignore_install)
        if install is not None:
            return self._run_install(name, install, conf, params or [])
        kver = self.kernel
        carried = self.state.get("initramfs_stage")
        if carried is not None and name not in carried:
            # inside the initramfs only the modules mkinitramfs copied exist (boot_modules.py)
            return (
                False,
                f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{kver}",
            )
        if name in self._device_drivers() and name not in IN_TREE:
            return self._load_device_driver(name)
        ko = None if name in IN_TREE else self.find_ko(name)
        if name not in IN_TREE and ko is None:
            return (
                False,
                f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{kver}",
            )
        if name in IN_TREE and not self.in_tree(name, kver):
            return (
                False,
                f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{kver}",
            )
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

    def _run_install(
        self, name: str, install: str, conf: dict, params: list[str]
    ) -> tuple[bool, str]:
        """Run the install command instead of inserting (kmod module_do_install_commands):
        $CMDLINE_OPTS becomes the module's modprobe.d options plus those given to modprobe."""
        options = " ".join([*conf["options"].get(name, []), *params])
        command = install.replace("$CMDLINE_OPTS", options)
        self.save()  # the command's own modprobe calls read and change the saved state
        if self.state.get("live_sysfs"):
            sysfs_ctl.hold_all(self.root)  # so the command's writes to them never wait
        runner = self.install_runner or self._chroot_runner
        rc, output = runner(command, {"MODPROBE_MODULE": name})
        path = self.p(STATE)
        self.state = json.loads(path.read_text()) if path.exists() else self.state
        # sysfs writes the command made take effect, as they would at once (PciBinding's, in Hw)
        self.apply_writes()  # type: ignore[attr-defined]
        for line in output.splitlines():
            self.klog(f"modprobe[{name}]: {line}")
        if rc != 0:
            return False, (
                "modprobe: ERROR: ../libkmod/libkmod-module.c:1013 command_do() Error running"
                f" install command '{command}' for module {name}: retcode {rc}\n"
                f"modprobe: ERROR: could not insert '{name}': Invalid argument"
            )
        return True, ""

    def _chroot_runner(self, command: str, env: dict[str, str]) -> tuple[int, str]:
        argv = ["/bin/sh", "-c", command]
        extra = {}
        if str(self.root) != "/" and self.p("bin/sh").exists():
            argv = ["chroot", str(self.root), *argv]
        elif str(self.root) != "/":  # a bare test root: the shims find it through TWIN_ROOT
            extra["TWIN_ROOT"] = str(self.root)
        proc = subprocess.run(
            argv,
            env={"PATH": BOOT_PATH, "LC_ALL": "C", **extra, **env},
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.returncode, proc.stdout + proc.stderr

    def _device_drivers(self) -> set[str]:
        """Modules of the profile's devices (snd_hda_intel, nvme, xhci_pci...): loadable
        modules of the simulated kernel, reached by modprobe only through an install command's
        --ignore-install (otherwise coldplug binds them directly)."""
        return set(self.device_modules())

    def _load_device_driver(self, name: str) -> tuple[bool, str]:
        driver = self.device_modules()[name]
        self.modules()[name] = {
            "path": f"kernel/drivers/{name}.ko",
            "params": {},
            "deps": [],
            "version": "",
            "license": "GPL",
            "intree": True,
        }
        self.bind_all(driver)
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
            # A real kernel would not say it; the host bricked instead (docs/hazards.md). The twin
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
        elif name == "nvidia" and self.gsp_mismatch(info.get("version", "")):
            self.klog(
                f"NVRM: RmInitAdapter: GSP firmware mismatch ({self.gsp_mismatch(info.get('version', ''))})"
            )
            self.klog("BUG: kernel NULL pointer dereference, address: 0000000000000008")
            self.klog("Oops: 0000 [#1] PREEMPT SMP NOPTI")
            why = f"GSP firmware mismatch: {self.gsp_mismatch(info.get('version', ''))}"
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

    def gsp_mismatch(self, version: str) -> str:
        """Releases of the blobs under nvidia/<version>/ that are not version ('' if none)."""
        stamp = b"twin GSP firmware "  # twin/modbuild.py's blobs name their release
        blobs = sorted(self.p(f"lib/firmware/nvidia/{version}").glob("gsp_*.bin"))
        found = {b.read_bytes() for b in blobs}
        releases = {f.removeprefix(stamp).strip().decode() for f in found if f.startswith(stamp)}
        wrong = sorted(releases - {version})
        return f"GSP firmware {', '.join(wrong)} under nvidia/{version}" if wrong else ""

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
        self.state["nvidia_minors"] = {}  # a fresh nv_minor_num_table (views.nvidia_minors)
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
            self.state["nvidia_minors"] = {}
        return True, ""


def _param_value(old: str, value: str) -> str:
    """Booleans read back as Y/N from /sys/module, like the kernel's param_get_bool."""
    if old in ("Y", "N"):
        return "Y" if value.lower() in ("1", "y", "yes", "on", "true") else "N"
    return value
