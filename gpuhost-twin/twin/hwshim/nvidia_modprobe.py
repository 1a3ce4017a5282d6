"""nvidia-modprobe: loads NVIDIA's modules and makes their device nodes, silently."""

from __future__ import annotations

from .common import load_hw


def nvidia_modprobe(argv: list[str]) -> int:
    """nvidia-modprobe [-u] [-c=N|-c N] [-m]: load modules, make device nodes; silent like the real one."""
    hw = load_hw()
    if hw is None or not hw.kernel:
        return 1
    uvm = "-u" in argv or "--unified-memory" in argv
    minors = [
        int(a.split("=", 1)[1])
        for a in argv
        if a.startswith(("-c=", "--create-nvidia-device-file="))
    ]
    if "-c" in argv:
        minors.append(int(argv[argv.index("-c") + 1]))
    ok, _ = hw.load("nvidia")
    if ok and uvm:
        ok, _ = hw.load("nvidia_uvm")
    if ok and "-m" in argv:
        ok, _ = hw.load("nvidia_modeset")
    hw.write_views()
    if ok and uvm:
        hw.make_uvm_nodes()
    present = {g["minor"] for g in hw.nvidia_gpus()}
    hw.save()
    return 0 if ok and all(m in present for m in minors) else 1
