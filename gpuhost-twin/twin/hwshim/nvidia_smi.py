"""nvidia-smi: query CSV, plain table, -L, -q, topo -m, topo -p2p, --version, nvlink -s, bad -i;
formats follow the real captures in tests/fixtures/captures/h200x2."""

from __future__ import annotations

import json
import os
import re
import signal
import time

from .common import err, hwsim, load_hw, out
from .smi_health import HBM_BOARD, memory_health
from .smi_text import (
    BAR,
    CUDA_BY_BRANCH,
    NO_DRIVER,
    P2P_LEGEND,
    PLAIN_HEAD,
    PLAIN_TAIL,
    Q_BLOCK,
    TOPO_LEGEND,
)

UNITS = {
    "memory.total": "MiB",
    "memory.used": "MiB",
    "memory.free": "MiB",
    "memory.reserved": "MiB",
    "power.draw": "W",
    "power.limit": "W",
    "enforced.power.limit": "W",
    "utilization.gpu": "%",
    "utilization.memory": "%",
    "fan.speed": "%",
    "clocks.sm": "MHz",
    "clocks.max.sm": "MHz",
    "clocks.mem": "MHz",
}


ALIASES = {
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_serial": "serial",
    "gpu_bus_id": "pci.bus_id",
}


class SmiError(Exception):
    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text, self.code = text, code


def bus_id(bdf: str) -> str:
    return (
        "0000" + bdf.upper().replace("0000:", "", 1).join(["", ""])
        if False
        else f"0000{bdf}".upper()
    )


def cuda_version(driver: str) -> str:
    return CUDA_BY_BRANCH.get(int(driver.split(".")[0]), "13.0")


def library_version(hw: hwsim.Hw) -> str | None:
    """Version of the installed userspace libnvidia-ml, if any (.run or packages put it here)."""
    for d in ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib"):
        for lib in sorted(hw.p(d).glob("libnvidia-ml.so.*.*")) if hw.p(d).is_dir() else []:
            return lib.name.split(".so.", 1)[1]
    return None


def smi_persistence(hw: hwsim.Hw, select: str | None, on: bool) -> str:
    """nvidia-smi [-i ID] -pm 0|1. With nvidia-persistenced running, nvidia-smi asks the daemon
    to hold or let go of that GPU (its per-device RPC, nvpdsetpersistencemode); the twin's
    stand-in takes the request from released.json and SIGUSR1 and answers in held.json.
    Without the daemon the driver's legacy persistence mode is set."""
    run = hw.p("run/nvidia-persistenced")
    try:
        pid = int((run / "nvidia-persistenced.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        pid = 0
    text = ""
    for g in smi_gpus(hw, select):
        state = "Enabled" if on else "Disabled"
        if bool(g["persistence_mode"]) == on:
            text += f"Persistence mode is already {state} for GPU {bus_id(g['bdf'])}.\n"
            continue
        if pid:
            # The daemon's table is the one it built at its start (twin/nvinstaller.py): a GPU
            # it does not have answers NVPD_ERR_DEVICE_NOT_FOUND, and nvidia-smi fails with NVML's
            # "Not Found" (exit 6, "a query to find an object was unsuccessful", nvidia-smi(1)).
            table = run / "devices.json"
            known = json.loads(table.read_text()) if table.exists() else {}
            if g["bdf"] not in known:
                raise SmiError(
                    text + f"Unable to set persistence mode for GPU {bus_id(g['bdf'])}: Not Found\n"
                    "Terminating early due to previous errors.\n",
                    6,
                )
            path = run / "released.json"
            released = set(json.loads(path.read_text())) if path.exists() else set()
            released = (released - {g["minor"]}) if on else (released | {g["minor"]})
            path.write_text(json.dumps(sorted(released)))
            os.kill(pid, signal.SIGUSR1)
            for _ in range(50):  # the daemon answers in held.json
                held = json.loads((run / "held.json").read_text())
                if (g["minor"] in held) == on:
                    break
                time.sleep(0.05)
        else:
            with hwsim.locked(hw.root):
                fresh = hwsim.Hw(hw.root)
                fresh.state.setdefault("persistence", {})[g["bdf"]] = on
                fresh.save()
        text += f"{state} persistence mode for GPU {bus_id(g['bdf'])}.\n"
    return text + "All done.\n"


def smi_gpus(hw: hwsim.Hw, select: str | None) -> list[dict]:
    gpus = [g for g in hw.nvidia_gpus() if not g["failed"]]
    for index, g in enumerate(gpus):
        g["index"] = index
    if not gpus:
        raise SmiError("No devices were found\n", 6)
    if select is None:
        return gpus
    chosen = []
    for want in select.split(","):
        want = want.strip()
        for g in gpus:
            ids = {str(g["index"]), g["uuid"], bus_id(g["bdf"]), g["bdf"], g["bdf"][5:]}
            if want in ids or want.upper() in ids:
                chosen.append(g)
                break
        else:
            raise SmiError("No devices were found\n", 6)
    return chosen


def query_value(field: str, g: dict, hw: hwsim.Hw, count: int) -> str:
    dev = hw.devices()[g["bdf"]]
    driver = hw.state["nvidia"]["version"]
    reserved = 616 if g["memory_mib"] > 100000 else 512
    na = "[N/A]"
    values = {
        "index": str(g["index"]),
        "count": str(count),
        "name": g["name"],
        "uuid": g["uuid"],
        "serial": g["serial"] if g["serial"] != "N/A" else na,
        "pci.bus_id": bus_id(g["bdf"]),
        "pci.domain": "0x" + g["bdf"][:4],
        "pci.bus": "0x" + g["bdf"][5:7].upper(),
        "pci.device": "0x" + g["bdf"][8:10].upper(),
        "pci.baseClass": "0x" + dev["class"][:2].upper(),
        "pci.subClass": "0x" + dev["class"][2:4].upper(),
        "pci.device_id": "0x" + f"{dev['device']}{dev['vendor']}".upper(),
        "pci.sub_device_id": "0x" + f"{dev['subsystem_device']}{dev['subsystem_vendor']}".upper(),
        "driver_version": driver,
        "vbios_version": g["vbios"],
        "compute_cap": g["compute_cap"],
        "persistence_mode": "Enabled" if g["persistence_mode"] else "Disabled",
        "memory.total": f"{g['memory_mib']} MiB",
        "memory.reserved": f"{reserved} MiB",
        "memory.used": "0 MiB",
        "memory.free": f"{g['memory_mib'] - reserved + 1} MiB",
        "temperature.gpu": str(g["temperature_c"]),
        # the real H200 read its HBM 5 degrees above the core (35, 40) at idle
        "temperature.memory": str(g["temperature_c"] + 5) if HBM_BOARD.search(g["name"]) else na,
        "power.draw": f"{g['power_draw_w']:.2f} W",
        "power.limit": f"{g['power_limit_w']:.2f} W",
        "enforced.power.limit": f"{g['power_limit_w']:.2f} W",
        "utilization.gpu": "0 %",
        "utilization.memory": "0 %",
        "pstate": "P0",
        "fan.speed": na if g["fan"] == "N/A" else g["fan"].replace("%", " %"),
        "mig.mode.current": na if g["mig"] is None else ("Enabled" if g["mig"] else "Disabled"),
        "ecc.mode.current": "Enabled" if g["ecc"] else "Disabled",
        "display_active": "Disabled",
        "compute_mode": "Default",
        "pcie.link.gen.max": "5",
        "pcie.link.gen.current": "5",
        "pcie.link.width.max": "16",
        "pcie.link.width.current": "16",
        "timestamp": time.strftime("%Y/%m/%d %H:%M:%S.000"),
        **memory_health(g),
    }
    if field not in values:
        raise SmiError(f'Field "{field}" is not a valid field to query.\n\n', 2)
    return values[field]


def smi_query(hw: hwsim.Hw, fields: str, fmt: str | None, select: str | None) -> str:
    if fmt is None:
        raise SmiError("Format of the output must be specified via --format option.\n", 2)
    opts = set(fmt.split(","))
    if "csv" not in opts:
        raise SmiError(f'"{fmt}" is not a valid format.\n', 2)
    names = [f.strip() for f in fields.split(",") if f.strip()]
    canon = [ALIASES.get(n, n) for n in names]
    gpus = smi_gpus(hw, select)
    rows = []
    if "noheader" not in opts:
        rows.append(
            ", ".join(
                f"{n} [{UNITS[c]}]" if c in UNITS else n for n, c in zip(names, canon, strict=True)
            )
        )
    for g in gpus:
        cells = [query_value(c, g, hw, len(gpus)) for c in canon]
        if "nounits" in opts:
            cells = [re.sub(r" (MiB|W|%|MHz)$", "", c) for c in cells]
        rows.append(", ".join(cells))
    return "".join(r + "\n" for r in rows)


def smi_plain(hw: hwsim.Hw, select: str | None) -> str:
    gpus = smi_gpus(hw, select)
    ver = hw.state["nvidia"]["version"]
    text = time.strftime("%a %b %d %H:%M:%S %Y") + "       \n"
    text += PLAIN_HEAD.format(ver=ver, cuda=cuda_version(ver))
    for g in gpus:
        name = g["name"] if len(g["name"]) <= 27 else g["name"][:24] + "..."
        pm = "On" if g["persistence_mode"] else "Off"
        ecc = "0" if g["ecc"] else "Off"
        mig = "N/A" if g["mig"] is None else ("Enabled" if g["mig"] else "Disabled")
        power = f"{g['power_draw_w']}W / {g['power_limit_w']:>4}W"
        text += f"|{g['index']:>4}  {name:<30} {pm:<3} |{bus_id(g['bdf']):>19} Off |{ecc:>21} |\n"
        text += f"| {g['fan']:<4}{g['temperature_c']:>4}C    P0{power:>24} |"
        text += f"{'0MiB':>11} / {str(g['memory_mib']) + 'MiB':>9} |      0%      Default |\n"
        text += f"|{'':41}|{'':24}|{mig:>21} |\n{BAR}\n"
    return text + PLAIN_TAIL


def smi_q(hw: hwsim.Hw, select: str | None) -> str:
    gpus = smi_gpus(hw, select)
    ver = hw.state["nvidia"]["version"]
    head = [
        ("Timestamp", time.strftime("%a %b %d %H:%M:%S %Y")),
        ("Driver Version", ver),
        ("CUDA Version", cuda_version(ver)),
    ]
    text = "\n==============NVSMI LOG==============\n\n"
    text += "".join(f"{k:<55}: {v}\n" for k, v in head)
    text += f"\n{'Attached GPUs':<55}: {len(hw.nvidia_gpus())}\n"
    gsp = ver if hw._gsp_firmware(ver) else "N/A"
    for g in gpus:
        dev = hw.devices()[g["bdf"]]
        reserved = 616 if g["memory_mib"] > 100000 else 512
        values = {
            "name": g["name"],
            "arch": g["architecture"],
            "persistence": "Enabled" if g["persistence_mode"] else "Disabled",
            "mig": "N/A" if g["mig"] is None else ("Enabled" if g["mig"] else "Disabled"),
            "serial": g["serial"],
            "uuid": g["uuid"],
            "pdi": g["pdi"],
            "minor": g["minor"],
            "vbios": g["vbios"],
            "board_id": g["board_id"],
            "board_part": g["board_part_number"],
            "gpu_part": g["gpu_part_number"],
            "module_id": g["module_id"],
            "gsp": gsp,
            "pci_bus": "0x" + g["bdf"][5:7].upper(),
            "pci_device": "0x" + g["bdf"][8:10].upper(),
            "pci_domain": "0x" + g["bdf"][:4],
            "base_class": f"0x{int(dev['class'][:2], 16):x}",
            "sub_class": f"0x{int(dev['class'][2:4], 16):x}",
            "device_id": "0x" + f"{dev['device']}{dev['vendor']}".upper(),
            "busid": bus_id(g["bdf"]),
            "subsys_id": "0x" + f"{dev['subsystem_device']}{dev['subsystem_vendor']}".upper(),
            "fan": g["fan"].replace("%", " %"),
            "mem_total": g["memory_mib"],
            "mem_reserved": reserved,
            "mem_free": g["memory_mib"] - reserved + 1,  # rounding, as captured
            "ecc": "Enabled" if g["ecc"] else "Disabled",
            "temp": g["temperature_c"],
            "power_draw": g["power_draw_w"],
            "power_limit": g["power_limit_w"],
        }
        text += f"GPU {bus_id(g['bdf'])}\n"
        for line in Q_BLOCK.format(**values).splitlines():
            key, sep, value = line.partition(" : ")
            text += f"{key:<55}: {value}\n" if sep else line + "\n"
        text += "\n"
    return text


def smi_topo(hw: hwsim.Hw, args: list[str]) -> str:
    gpus = smi_gpus(hw, None)
    order = [next(i for i, p in enumerate(hw.gpus()) if p["bdf"] == g["bdf"]) for g in gpus]
    topo = hw.profile["topology"]
    names = [f"GPU{g['index']}" for g in gpus]
    if args[:1] == ["-m"]:
        text = "\t\x1b[4m" + "\t".join([*names, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
        text += "\x1b[0m\n"
        for r, g in zip(order, gpus, strict=True):
            cells = [" X " if r == c else topo["links"][r][c] for c in order]
            text += "\t".join(
                [f"GPU{g['index']}", *cells, g["cpu_affinity"], g["numa_affinity"], ""]
            )
            text += f"\t{g['gpu_numa_id']}\n"
        return text + TOPO_LEGEND
    if args[:1] == ["-p2p"] and len(args) > 1 and args[1] in topo["p2p"]:
        matrix = topo["p2p"][args[1]]
        text = " \t\x1b[4m" + "".join(n + "\t" for n in names) + "\x1b[0m\n"
        for r, g in zip(order, gpus, strict=True):
            text += f" GPU{g['index']}\t" + "".join(matrix[r][c] + "\t" for c in order) + "\n"
        return text + P2P_LEGEND
    raise SmiError(
        "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n", 2
    )


def nvidia_smi(argv: list[str]) -> int:
    hw = load_hw()
    if hw is None or not hw.loaded("nvidia"):
        out(NO_DRIVER)
        return 9
    ver = hw.state["nvidia"]["version"]
    lib = library_version(hw)
    if lib is not None and lib != ver:
        out(
            f"Failed to initialize NVML: Driver/library version mismatch\nNVML library version: {lib}\n"
        )
        return 18
    select = fields = fmt = None
    rest: list[str] = []
    args = list(argv)
    while args:
        a = args.pop(0)
        if a in ("-i", "--id"):
            select = args.pop(0) if args else ""
        elif a.startswith(("--id=", "-i=")):
            select = a.split("=", 1)[1]
        elif a.startswith("--query-gpu="):
            fields = a.split("=", 1)[1]
        elif a.startswith("--format="):
            fmt = a.split("=", 1)[1]
        else:
            rest.append(a)
    try:
        if rest in (["--version"], ["-v"]):
            out(
                f"NVIDIA-SMI version  : {ver}\nNVML version        : {ver.rsplit('.', 1)[0]}\n"
                f"DRIVER version      : {ver}\nCUDA Version        : {cuda_version(ver)}\n"
            )
        elif fields is not None:
            out(smi_query(hw, fields, fmt, select))
        elif rest in (["-L"], ["--list-gpus"]):
            out(
                "".join(
                    f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n"
                    for g in smi_gpus(hw, select)
                )
            )
        elif rest in (["-q"], ["--query"]):
            out(smi_q(hw, select))
        elif rest[:1] == ["topo"]:
            out(smi_topo(hw, rest[1:]))
        elif len(rest) == 2 and rest[0] in ("-pm", "--persistence-mode") and rest[1] in ("0", "1"):
            out(smi_persistence(hw, select, rest[1] == "1"))
        elif rest == ["nvlink", "-s"]:
            links = hw.profile["nvidia"]["nvlink_links"]
            speed = hw.profile["nvidia"]["nvlink_gbps"]
            for g in smi_gpus(hw, select) if links else []:
                out(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n")
                out("".join(f"\t Link {k}: {speed} GB/s\n" for k in range(links)))
        elif not rest:
            out(smi_plain(hw, select))
        else:
            err(f"twin: nvidia-smi {' '.join(argv)} is not simulated")
            return 2
    except SmiError as e:
        out(e.text)
        return e.code
    return 0
