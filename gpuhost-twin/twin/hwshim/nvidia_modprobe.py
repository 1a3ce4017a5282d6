"""nvidia-modprobe: loads NVIDIA's modules and makes their device nodes, silently."""

from __future__ import annotations

from .common import load_hw


def nvidia_modprobe(argv: list[str]) -> int:
    """nvidia-modprobe [-u] [-m] [-c=N|-c N]... [-f=FILE|-f FILE]...: load the modules; make
    /dev/nvidiaN + /dev/nvidiactl (-c), /dev/nvidia-uvm{,-tools} (-u; -c is then uvm's base
    minor, only 0 simulated), /dev/nvidia-caps/
    nvidia-capN from a capability proc file (-f). Silent like the real one; 1 on any failure."""
    hw = load_hw()
    if hw is None or not hw.kernel:
        return 1
    uvm = "-u" in argv or "--unified-memory" in argv
    minors: list[int] = []
    caps: list[str] = []
    it = iter(argv)
    for a in it:
        key, eq, value = a.partition("=")
        if key in ("-c", "--create-nvidia-device-file"):
            minors.append(int(value if eq else next(it, "-1")))
        elif key in ("-f", "--nvidia-capability-device-file"):
            caps.append(value if eq else next(it, ""))
    ok, _ = hw.load("nvidia")
    if ok and uvm:
        ok, _ = hw.load("nvidia_uvm")
    if ok and "-m" in argv:
        ok, _ = hw.load("nvidia_modeset")
    hw.write_views()
    if ok and uvm:  # with -u, -c names the uvm base minor (nvidia_uvm_mknod), not a GPU
        hw.make_uvm_nodes()
    elif ok and minors:
        ok = hw.make_gpu_nodes(minors)
    for cap in caps:
        ok = hw.make_cap_node(cap) and ok
    hw.save()
    return 0 if ok else 1
