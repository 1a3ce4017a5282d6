"""The initramfs the loader hands a kernel at boot (stdlib plus twin): what boot_modules loads
early and where the trial backstop (twin/boot_stop.py) is looked for. The twin's images are JSON
records of the module configuration (twin.pve.initramfs)."""

from __future__ import annotations

import json
from pathlib import Path

from twin import hwsim

BOOTCFG = "var/lib/gpuhost-twin/bootcfg.json"  # the loader's files as the last refresh wrote them


def initramfs_of(hw: hwsim.Hw, kver: str) -> dict | None:
    """The initramfs the loader hands this kernel: the ESP copy recorded at the last refresh
    (bootcfg "initrd"), else /boot/initrd.img-<kver>; a JSON record of the module configuration
    written by the twin's update-initramfs ({"files": {path: text}}). Anything else (a real
    image, or none) contributes no early modules; "initramfs" in hw.json says which it was."""
    data: object = None
    cfg_path = hw.p(BOOTCFG)
    synced = json.loads(cfg_path.read_text()).get("initrd") if cfg_path.exists() else None
    own = hw.state.get("boot_initrd")  # an ESP entry of its own names its initrd file
    if own:
        try:
            data = json.loads(Path(own).read_text())
            hw.state["initramfs"] = "esp entry"
        except (OSError, ValueError):
            hw.state["initramfs"] = "missing on the ESP"
    elif isinstance(synced, dict):
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
