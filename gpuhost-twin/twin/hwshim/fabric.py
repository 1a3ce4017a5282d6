"""gpuhost-twin-fabric: the twin's stand-in for what nvidia-fabricmanager does through the
NVSwitch driver (its ioctls on /dev/nvidia-nvswitchctl and the GPUs): configure the NVLink
fabric, after which the driver reports each GPU's fabric state "Completed" and CUDA starts.

    gpuhost-twin-fabric configure VERSION   # as nv-fabricmanager of VERSION: 0 when done
    gpuhost-twin-fabric state               # in_progress | completed | none (no NVSwitch)

Like the real daemon it refuses a driver of another version (the fabric manager must be of
exactly the loaded driver's version) and a host where the driver is not loaded. The state is
this boot's: a reboot (driver reload) starts again at "In Progress".
"""

from __future__ import annotations

import sys

from .common import hwsim, load_hw


def fabric(argv: list[str]) -> int:
    hw = load_hw()
    if hw is None:
        sys.stderr.write("gpuhost-twin-fabric: no simulated machine here\n")
        return 1
    if argv[:1] == ["state"]:
        print(hw.state.get("fabric", "in_progress") if hwsim.rm.nvswitches(hw) else "none")
        return 0
    if len(argv) != 2 or argv[0] != "configure":
        sys.stderr.write("usage: gpuhost-twin-fabric configure VERSION | state\n")
        return 2
    version = argv[1]
    if not hwsim.rm.nvswitches(hw):
        sys.stderr.write("No NVSwitch devices found; nothing to configure\n")
        return 1
    if not hw.loaded("nvidia"):
        sys.stderr.write("NVIDIA driver is not loaded; cannot configure the NVSwitches\n")
        return 1
    loaded = hw.state["nvidia"]["version"]
    if loaded != version:
        sys.stderr.write(
            f"fabric manager version {version} does not match the loaded NVIDIA driver "
            f"version {loaded}; install the fabric manager of the driver's version\n"
        )
        return 1
    hw.state["fabric"] = "completed"
    hw.write_views()
    hw.save()
    return 0
