"""Kernel modules at boot: initramfs, modules-load, udev coldplug and binding.

The race (docs/hazards.md "GPUs in VMs"): systemd-modules-load.service and udev's coldplug
(systemd-udev-trigger + udevd's workers) run with no ordering between them, and udev handles
devices' "add" events in parallel, so a udev rule that writes a device's driver_override can
run after nvidia was loaded, by modules-load or by another board's modalias autoload; loading
nvidia probes every matching board at once. The twin always plays the losing order, so that a
binding that relies on udev rules alone visibly loses:

1. initramfs (its record: the module configuration and udev rules as of the last
   update-initramfs; ESP hosts boot the copy synced at the last refresh, bootcfg
   "initrd"): udev coldplug first autoloads what the initramfs carries (the modules of
   /etc/initramfs-tools/modules: the only .ko files the twin puts there), then applies the
   initramfs's udev rules (Debian's udev hook copies a fixed list of rules files plus every
   /etc/udev/rules.d/*.rules without a /usr/lib twin); then load_modules loads the listed
   modules. So a rule that made it into the initramfs sets its override before the real root.
2. modules-load: modules-load=... on the command line, /usr/lib|/lib|/etc/modules-load.d/*.conf,
   /etc/modules;
3. udev coldplug in the real root, per device in BDF order: modalias autoload first (nouveau
   unless blacklisted — it binds none of these GPUs —, nvidia when its .ko exists, the device's
   own driver: snd_hda_intel, nvme...), and only then driver_override from the udev rules
   (KERNEL=="<bdf>" ... ATTR{driver_override}="...") and the ``early_hook``.

Every load goes through modprobe's rules (hwsim/modules.py): a modprobe.d ``install`` command
runs for real through /bin/sh chrooted into the twin (in the initramfs stage only when the
files it names are in the initramfs), with the hardware state saved before and read back after,
so whatever the command writes to sysfs or loads with its own modprobe counts. Binding follows
the kernel: driver_override decides; else vfio-pci takes its ids=, nvidia takes NVIDIA
display-class functions. /dev/nvidia-uvm* appear only through nvidia-modprobe -u.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from twin import hwsim
from twin.initrd import initramfs_of

# What an initramfs always has (busybox, kmod): an install command may name them.
INITRAMFS_BINARIES = ("/bin/sh", "/sbin/modprobe", "/usr/sbin/modprobe", "/bin/true", "/bin/false")


def root_rules(hw: hwsim.Hw) -> dict[str, str]:
    """The real root's udev rules: {file name: text}; /etc overrides /lib and /usr/lib."""
    files: dict[str, str] = {}
    for d in ("lib/udev/rules.d", "usr/lib/udev/rules.d", "etc/udev/rules.d"):
        for f in sorted(hw.p(d).glob("*.rules")) if hw.p(d).is_dir() else []:
            files[f.name] = f.read_text(errors="replace")
    return files


def _apply_udev_overrides(hw: hwsim.Hw, rules: dict[str, str]) -> None:
    """driver_override set by udev rules at device add: KERNEL=="<bdf>" ... ATTR{driver_override}."""
    for name in sorted(rules):
        for line in rules[name].splitlines():
            if line.lstrip().startswith("#"):
                continue
            bdf = re.search(r'KERNELS?=="([0-9a-f:.]+)"', line)
            value = re.search(r'ATTR\{driver_override\}="([^"]*)"', line)
            if bdf and value and bdf.group(1) in hw.devices():
                hw.write(
                    f"sys/bus/pci/devices/{bdf.group(1)}/driver_override", value.group(1) + "\n"
                )


def _initramfs_runner(hw: hwsim.Hw, files: dict[str, str]):
    """Install commands in the initramfs: they run only if what they name is in it."""

    def run(command: str, env: dict[str, str]) -> tuple[int, str]:
        for word in shlex.split(command.replace("&&", " ").replace(";", " ")):
            # a program or script the command names by path must be in the initramfs (which
            # carries the kernel's module tree and its depmod indexes, /lib/modules/<kver>/)
            if word.startswith(("/sys/", "/proc/", "/dev/", "/run/", "/lib/modules/")):
                continue
            if not word.startswith("/"):
                continue
            if word not in files and word not in INITRAMFS_BINARIES:
                return 127, f"sh: 1: {word}: not found"
        return hw._chroot_runner(command, env)

    return run


def _names(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        words = line.split("#", 1)[0].strip()
        if words and not words.startswith(";"):
            out.append(words.split())
    return out


def _builtin_drivers(hw: hwsim.Hw) -> None:
    """Drivers built into the kernel bind their devices as the bus registers them, before the
    initramfs runs anything: no modprobe, so no install command (a claim) runs for them."""
    for module, driver in sorted(hw.device_modules().items()):
        if hw.builtin(module):
            hw.bind_all(driver)


def carried_modules(hw: hwsim.Hw, record: dict, listed: list[str]) -> set[str]:
    """The modules mkinitramfs put in this initramfs, with their dependencies: those of
    /etc/initramfs-tools/modules and of hooks' manual_add_modules/force_load lines (the record
    names them), and with MODULES=most what auto_add_modules copies by directory
    (initramfs-tools hook-functions: kernel/drivers/usb/host, i2c/busses, net, nvme... but
    neither vfio nor the GPU drivers)."""
    names = {hwsim.norm(m) for m in [*record.get("modules", []), *listed]}
    if record.get("modules_policy", "most") == "most":
        names |= {m for m in hw.device_modules() if _most_carries(m)}
    carried: set[str] = set()
    todo = [n for n in names if hw.module_exists(n) or n in hw.device_modules()]
    while todo:
        name = todo.pop()
        if name not in carried:
            carried.add(name)
            todo += hwsim.IN_TREE.get(name, {}).get("deps", [])
    return carried


def _most_carries(module: str) -> bool:
    directory = hwsim.MODULE_DIRS.get(module, "")
    return directory.startswith(MOST_DIRS) or module in MOST_NAMES


# initramfs-tools hook-functions auto_add_modules (base, net, block, scsi, ata, mmc...): the
# directories it copies whole and the modules it names, as far as the twin's devices go.
MOST_DIRS = (
    "kernel/drivers/usb/host",
    "kernel/drivers/i2c/busses",
    "kernel/drivers/net",
    "kernel/drivers/nvme",
    "kernel/drivers/block",
    "kernel/drivers/scsi",
    "kernel/drivers/ata",
    "kernel/drivers/mmc",
)
MOST_NAMES = ("virtio_pci", "virtio_mmio")


def _load_modules(hw: hwsim.Hw) -> None:
    conf = hw.modprobe_conf()
    kver = hw.kernel
    _builtin_drivers(hw)
    # 1. initramfs: its own copy of the module configuration and udev rules
    record = initramfs_of(hw, kver)
    if record is not None:
        files = record.get("files", {})
        early_conf = hw.modprobe_conf(
            {
                k: v
                for k, v in files.items()
                if k.startswith(("/etc/modprobe.d/", "/lib/modprobe.d/")) and k.endswith(".conf")
            }
        )
        listed = []
        for line in files.get("/etc/initramfs-tools/modules", "").splitlines():
            words = line.split("#", 1)[0].split()
            if words:
                listed.append(words)
        rules = {
            k.rsplit("/", 1)[1]: v
            for k, v in files.items()
            if "/udev/rules.d/" in k and k.endswith(".rules")
        }
        hw.install_runner = _initramfs_runner(hw, files)
        carried = carried_modules(hw, record, [w[0] for w in listed])
        hw.state["initramfs_stage"] = sorted(carried)  # the modprobe shim reads it too
        _coldplug(hw, early_conf, rules, lambda m: hwsim.norm(m) in carried)
        for words in listed:
            _load(hw, words[0], words[1:], early_conf)
        del hw.state["initramfs_stage"]
        # what the initramfs had bound before the real root (its keyboard at a prompt)
        hw.state["initramfs_bindings"] = {b: d for b, d in hw.state["bindings"].items() if d}
    hw.install_runner = None  # the real root: the default runner, chrooted into the twin
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
    if hw.module_exists(kvm):  # udev's CPU modalias autoload: nothing when there is no module
        _load(hw, kvm, [], conf)
    _coldplug(hw, conf, root_rules(hw), lambda m: hw.module_exists(m) or m in hw._device_drivers())
    if not hw.loaded("nvidia") and "nvidia" not in hw.state:
        ko = hw.find_ko("nvidia")
        why = (
            "nothing loaded it (blacklisted, or no alias match)"
            if ko
            else f"no nvidia.ko for {kver}"
        )
        hw.state["nvidia"] = {"loaded": False, "reason": why}


def _coldplug(hw: hwsim.Hw, conf: dict, rules: dict[str, str], available) -> None:
    """udev's coldplug, the losing order: every device's modalias autoload, then the rules."""
    for bdf, dev in sorted(hw.devices().items()):
        if hw.state["bindings"].get(bdf):
            continue
        if dev["vendor"] == "10de" and dev["class"].startswith("03"):
            for alias in ("nouveau", "nvidia"):
                if alias not in conf["blacklist"] and available(alias):
                    _load(hw, alias, [], conf)
        elif dev.get("driver") and dev["driver"] != hwsim.BRIDGE_DRIVER:
            name = hwsim.norm((dev.get("modules") or [dev["driver"]])[0])  # xhci_pci: xhci_hcd
            if name in conf["install"] and available(name):
                _load(hw, name, [], conf)  # its install command runs, then it binds
            elif hw.driver_override(bdf) in (None, dev["driver"]) and available(name):
                hw.bind_all(dev["driver"])  # the driver was there already (built in or loaded)
        elif dev.get("driver"):
            hw.bind_all(dev["driver"])
    _apply_udev_overrides(hw, rules)


def _load(hw: hwsim.Hw, name: str, params: list[str], conf: dict) -> None:
    ok, message = hw.load(name, params, conf)
    if not ok:
        for line in message.splitlines():
            hw.klog(f"systemd-modules-load: {line}")
