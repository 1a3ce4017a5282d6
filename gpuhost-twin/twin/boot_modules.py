"""Kernel modules at boot: initramfs, modules-load, udev coldplug and binding.

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
import re
from pathlib import Path

from twin import hwsim
from twin.kernel_choice import BOOTCFG


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
