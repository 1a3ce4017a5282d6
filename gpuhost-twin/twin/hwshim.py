"""Hardware-facing tools of the twin, stdlib only; one entry per tool: main(tool, argv) -> exit code.

Installed as /usr/lib/gpuhost-twin/twin_hwshim.py next to twin_hwsim.py; each tool is a
three-line wrapper (see hardware.py). $TWIN_ROOT (default "/") is the machine's root.

Output formats follow the real captures in tests/fixtures/captures/h200x2 (nvidia-smi: query CSV,
plain table, -L, -q, topo -m, topo -p2p, --version, nvlink -s, bad -i); lspci follows pciutils
3.9 and formats.md §7; lsmod/modprobe/modinfo/depmod follow kmod 30.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

try:  # inside the twin the module sits next to this one under another name
    import twin_hwsim as hwsim  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - the repository layout
    from twin import hwsim

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
# CUDA version the driver branch reports (580: captured; the others from NVIDIA's release notes).
CUDA_BY_BRANCH = {
    535: "12.2",
    550: "12.4",
    560: "12.6",
    565: "12.7",
    570: "12.8",
    575: "12.9",
    580: "13.0",
    590: "13.1",
    595: "13.2",
}
TOPO_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""
P2P_LEGEND = """
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  U    = Unknown
"""
BAR = "+-----------------------------------------+------------------------+----------------------+"
PLAIN_HEAD = """\
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {ver:<23}Driver Version: {ver:<15}CUDA Version: {cuda:<9}|
+-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|                                         |                        |               MIG M. |
|=========================================+========================+======================|
"""
PLAIN_TAIL = """
+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|  No running processes found                                                             |
+-----------------------------------------------------------------------------------------+
"""
# `nvidia-smi -q` per-GPU block from the capture: "<indent>Key : value"; values in braces are
# filled per GPU, the rest is the H200 capture verbatim (keys are padded to column 55 on output).
Q_BLOCK = """\
    Product Name : {name}
    Product Brand : NVIDIA
    Product Architecture : {arch}
    Display Mode : Requested functionality has been deprecated
    Display Attached : Yes
    Display Active : Disabled
    Persistence Mode : {persistence}
    Addressing Mode : None
    MIG Mode
        Current : {mig}
        Pending : {mig}
    Accounting Mode : Disabled
    Accounting Mode Buffer Size : 4000
    Driver Model
        Current : N/A
        Pending : N/A
    Serial Number : {serial}
    GPU UUID : {uuid}
    GPU PDI : {pdi}
    Minor Number : {minor}
    VBIOS Version : {vbios}
    MultiGPU Board : No
    Board ID : {board_id}
    Board Part Number : {board_part}
    GPU Part Number : {gpu_part}
    FRU Part Number : N/A
    Platform Info
        Chassis Serial Number : N/A
        Slot Number : N/A
        Tray Index : N/A
        Host ID : N/A
        Peer Type : N/A
        Module Id : {module_id}
        GPU Fabric GUID : N/A
    Inforom Version
        Image Version : G520.0282.02.02
        OEM Object : 2.1
        ECC Object : 7.16
        Power Management Object : N/A
    Inforom BBX Object Flush
        Latest Timestamp : N/A
        Latest Duration : N/A
    GPU Operation Mode
        Current : N/A
        Pending : N/A
    GPU C2C Mode : Disabled
    GPU Virtualization Mode
        Virtualization Mode : Pass-Through
        Host VGPU Mode : N/A
        vGPU Heterogeneous Mode : N/A
    GPU Recovery Action : None
    GSP Firmware Version : {gsp}
    IBMNPU
        Relaxed Ordering Mode : N/A
    PCI
        Bus : {pci_bus}
        Device : {pci_device}
        Domain : {pci_domain}
        Base Classcode : {base_class}
        Sub Classcode : {sub_class}
        Device Id : {device_id}
        Bus Id : {busid}
        Sub System Id : {subsys_id}
        GPU Link Info
            PCIe Generation
                Max : 5
                Current : 5
                Device Current : 5
                Device Max : 5
                Host Max : N/A
            Link Width
                Max : 16x
                Current : 16x
        Bridge Chip
            Type : N/A
            Firmware : N/A
        Replays Since Reset : 0
        Replay Number Rollovers : 0
        Tx Throughput : 1037 KB/s
        Rx Throughput : 550 KB/s
        Atomic Caps Outbound : N/A
        Atomic Caps Inbound : N/A
    Fan Speed : {fan}
    Performance State : P0
    Clocks Event Reasons
        Idle : Active
        Applications Clocks Setting : Not Active
        SW Power Cap : Not Active
        HW Slowdown : Not Active
            HW Thermal Slowdown : Not Active
            HW Power Brake Slowdown : Not Active
        Sync Boost : Not Active
        SW Thermal Slowdown : Not Active
        Display Clock Setting : Not Active
    Clocks Event Reasons Counters
        SW Power Capping : 0 us
        Sync Boost : 0 us
        SW Thermal Slowdown : 0 us
        HW Thermal Slowdown : 0 us
        HW Power Braking : 0 us
    Sparse Operation Mode : Disabled
    FB Memory Usage
        Total : {mem_total} MiB
        Reserved : {mem_reserved} MiB
        Used : 0 MiB
        Free : {mem_free} MiB
    BAR1 Memory Usage
        Total : 262144 MiB
        Used : 1 MiB
        Free : 262143 MiB
    Conf Compute Protected Memory Usage
        Total : 0 MiB
        Used : 0 MiB
        Free : 0 MiB
    Compute Mode : Default
    Utilization
        GPU : 0 %
        Memory : 0 %
        Encoder : 0 %
        Decoder : 0 %
        JPEG : 0 %
        OFA : 0 %
    Encoder Stats
        Active Sessions : 0
        Average FPS : 0
        Average Latency : 0
    FBC Stats
        Active Sessions : 0
        Average FPS : 0
        Average Latency : 0
    DRAM Encryption Mode
        Current : N/A
        Pending : N/A
    ECC Mode
        Current : {ecc}
        Pending : {ecc}
    ECC Errors
        Volatile
            SRAM Correctable : 0
            SRAM Uncorrectable Parity : 0
            SRAM Uncorrectable SEC-DED : 0
            DRAM Correctable : 0
            DRAM Uncorrectable : 0
        Aggregate
            SRAM Correctable : 0
            SRAM Uncorrectable Parity : 0
            SRAM Uncorrectable SEC-DED : 0
            DRAM Correctable : 0
            DRAM Uncorrectable : 0
            SRAM Threshold Exceeded : No
        Aggregate Uncorrectable SRAM Sources
            SRAM L2 : 0
            SRAM SM : 0
            SRAM Microcontroller : 0
            SRAM PCIE : 0
            SRAM Other : 0
        Channel Repair Pending : No
        TPC Repair Pending : No
        Unrepairable Memory : No
    Retired Pages
        Single Bit ECC : N/A
        Double Bit ECC : N/A
        Pending Page Blacklist : N/A
    Remapped Rows
        Correctable Error : 0
        Inactive Correctable Error : 0
        Uncorrectable Error : 0
        Inactive Uncorrectable Error : 0
        Pending : No
        Remapping Failure Occurred : No
        Bank Remap Availability Histogram
            Max : 3072 bank(s)
            High : 0 bank(s)
            Partial : 0 bank(s)
            Low : 0 bank(s)
            None : 0 bank(s)
    Temperature
        GPU Current Temp : {temp} C
        GPU T.Limit Temp : 50 C
        GPU Shutdown T.Limit Temp : -8 C
        GPU Slowdown T.Limit Temp : -2 C
        GPU Max Operating T.Limit Temp : 0 C
        GPU Target Temperature : N/A
        Memory Current Temp : {temp} C
        Memory Max Operating T.Limit Temp : 0 C
    GPU Power Readings
        Average Power Draw : {power_draw}.00 W
        Instantaneous Power Draw : {power_draw}.00 W
        Current Power Limit : {power_limit}.00 W
        Requested Power Limit : {power_limit}.00 W
        Default Power Limit : {power_limit}.00 W
        Min Power Limit : 200.00 W
        Max Power Limit : {power_limit}.00 W
    GPU Memory Power Readings\x20
        Average Power Draw : 37.16 W
        Instantaneous Power Draw : N/A
    Module Power Readings
        Average Power Draw : N/A
        Instantaneous Power Draw : N/A
        Current Power Limit : N/A
        Requested Power Limit : N/A
        Default Power Limit : N/A
        Min Power Limit : N/A
        Max Power Limit : N/A
    Power Smoothing : N/A
    Workload Power Profiles
        Requested Profiles : N/A
        Enforced Profiles : N/A
    Clocks
        Graphics : 525 MHz
        SM : 525 MHz
        Memory : 3201 MHz
        Video : 765 MHz
    Applications Clocks
        Graphics : 1980 MHz
        Memory : 3201 MHz
    Default Applications Clocks
        Graphics : 1980 MHz
        Memory : 3201 MHz
    Deferred Clocks
        Memory : N/A
    Max Clocks
        Graphics : 1980 MHz
        SM : 1980 MHz
        Memory : 3201 MHz
        Video : 1545 MHz
    Max Customer Boost Clocks
        Graphics : 1980 MHz
    Clock Policy
        Auto Boost : N/A
        Auto Boost Default : N/A
    Fabric
        State : Completed
        Status : Success
        CliqueId : 0
        ClusterUUID : 00000000-0000-0000-0000-000000000000
        Health
            Summary : N/A
            Bandwidth : N/A
            Route Recovery in progress : N/A
            Route Unhealthy : N/A
            Access Timeout Recovery : N/A
            Incorrect Configuration : N/A
            Partition Assigned : N/A
    Processes : None
    Capabilities
        EGM : disabled
"""
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


def out(text: str) -> None:
    sys.stdout.write(text)


def err(text: str) -> None:
    sys.stderr.write(text if text.endswith("\n") else text + "\n")


def root() -> Path:
    return Path(os.environ.get("TWIN_ROOT", "/"))


def load_hw() -> hwsim.Hw | None:
    try:
        return hwsim.Hw(root())
    except FileNotFoundError:
        return None


# -- nvidia-smi --------------------------------------------------------------------------------
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


# -- lspci ---------------------------------------------------------------------------------------
CLASSES = {
    "0600": "Host bridge",
    "0604": "PCI bridge",
    "0300": "VGA compatible controller",
    "0302": "3D controller",
    "0403": "Audio device",
    "0108": "Non-Volatile memory controller",
    "0200": "Ethernet controller",
    "0207": "Infiniband controller",
    "0880": "System peripheral",
    "0180": "Mass storage controller",
    "ff00": "Unassigned class",
}


def pci_names(hw: hwsim.Hw) -> dict[str, str]:
    """vendor and vendor:device names from the root's pci.ids, like lspci (Debian 12: 2023-04)."""
    ids: dict[str, str] = {}
    path = hw.p("usr/share/misc/pci.ids")
    if not path.exists():
        return ids
    vendor = ""
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("C "):
                break
            if not line.strip() or line.startswith("#") or line.startswith("\t\t"):
                continue
            if line.startswith("\t"):
                ids[f"{vendor}:{line[1:5]}"] = line[7:].strip()
            else:
                vendor = line[:4]
                ids[vendor] = line[6:].strip()
    return ids


def lspci(argv: list[str]) -> int:
    hw = load_hw()
    if hw is None:
        err("lspci: twin: no hardware profile")
        return 1
    flags = set()
    select = None
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "-s":
            select = args.pop(0)
        elif a.startswith("-") and a not in ("-s", "-d"):
            flags.update(a.lstrip("-").replace("vv", "V"))
        elif a == "-d":
            args.pop(0)
    if "t" in flags:
        err("lspci: twin: the tree view (-t) is not simulated")
        return 1
    verbose = 2 if "V" in flags else (1 if "v" in flags else 0)
    numeric = "nn" if "nn" in "".join(argv) else ("n" if "n" in flags else "")
    names = pci_names(hw)
    bindings = hw.state.get("bindings", {})
    for bdf, dev in sorted(hw.devices().items()):
        if select and not (bdf.endswith(select) or bdf == select):
            continue
        cls = dev["class"][:4]
        cname = CLASSES.get(cls, f"Class {cls}")
        vname = names.get(
            dev["vendor"], hwsim.VENDORS.get(dev["vendor"], f"Vendor {dev['vendor']}")
        )
        dname = names.get(f"{dev['vendor']}:{dev['device']}", f"Device {dev['device']}")
        if not names and dev.get("name"):
            dname = dev["name"]
        shown = bdf if "D" in flags else bdf[5:]
        rev = f" (rev {dev['revision']})" if dev["revision"] != "00" else ""
        if numeric == "nn":
            line = (
                f"{shown} {cname} [{cls}]: {vname} {dname} [{dev['vendor']}:{dev['device']}]{rev}"
            )
        elif numeric == "n":
            line = f"{shown} {cls}: {dev['vendor']}:{dev['device']}{rev}"
        else:
            line = f"{shown} {cname}: {vname} {dname}{rev}"
        if verbose and cls == "0604":
            line += f" (prog-if {dev['class'][4:]} [Normal decode])"
        out(line + "\n")
        if dev["subsystem_vendor"] != "0000" and ("k" in flags or verbose):
            sv = names.get(dev["subsystem_vendor"], hwsim.VENDORS.get(dev["subsystem_vendor"], ""))
            sd = names.get(
                f"{dev['subsystem_vendor']}:{dev['subsystem_device']}",
                f"Device {dev['subsystem_device']}",
            )
            ids = (
                f" [{dev['subsystem_vendor']}:{dev['subsystem_device']}]" if numeric == "nn" else ""
            )
            out(f"\tSubsystem: {sv} {sd}{ids}\n")
        if verbose:
            out(lspci_verbose(hw, bdf, dev, verbose))
        driver = bindings.get(bdf)
        if "k" in flags or verbose:
            if driver:
                out(f"\tKernel driver in use: {driver}\n")
            mods = list(dev.get("modules", []))
            if dev["vendor"] == "10de" and cls.startswith("03"):
                mods += [m for m in ("nvidia_drm", "nvidia") if hw.module_exists(m)]
            if mods:
                out(f"\tKernel modules: {', '.join(mods)}\n")
        if verbose or "k" in flags:
            out("\n") if verbose else None
    return 0


def lspci_verbose(hw: hwsim.Hw, bdf: str, dev: dict, level: int) -> str:
    """The -v/-vv lines gpuhost reads (constructed from pciutils' format; formats.md §7)."""
    text = ""
    if dev["class"].startswith("0604"):
        text += f"\tFlags: bus master, fast devsel, latency 0, IRQ {dev['irq']}\n"
        kids = [b for b, d in hw.devices().items() if d.get("parent") == bdf]
        sec = min((int(k[5:7], 16) for k in kids), default=int(bdf[5:7], 16) + 1)
        text += f"\tBus: primary={bdf[5:7]}, secondary={sec:02x}, subordinate={sec:02x}, sec-latency=0\n"
    elif dev["irq"]:
        text += f"\tFlags: bus master, fast devsel, latency 0, IRQ {dev['irq']}\n"
    if dev["numa_node"] >= 0:
        text += f"\tNUMA node: {dev['numa_node']}\n"
    group = hw.state.get("groups", {}).get(bdf)
    if group is not None:
        text += f"\tIOMMU group: {group}\n"
    if level >= 2 and dev.get("acs"):
        text += "\tCapabilities: [2a0 v1] Access Control Services\n"
        text += "\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+\n"
        text += "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n"
    return text


# -- kmod tools ----------------------------------------------------------------------------------
def lsmod(argv: list[str]) -> int:
    hw = load_hw()
    mods = hw.modules() if hw else {}
    out("Module                  Size  Used by\n")
    for line in hw.p("proc/modules").read_text().splitlines() if hw and mods else []:
        name, size, refs, users = line.split()[:4]
        used = "" if users == "-" else " " + users.rstrip(",")
        out(f"{name:<19} {int(size):>8}  {refs}{used}\n")
    return 0


def modprobe(argv: list[str]) -> int:
    hw = load_hw()
    if hw is None or not hw.kernel:
        err("modprobe: FATAL: twin: the machine has not booted")
        return 1
    remove = quiet = all_names = dry = False
    words = []
    for a in argv:
        if a in ("-r", "--remove"):
            remove = True
        elif a in ("-q", "--quiet"):
            quiet = True
        elif a in ("-a", "--all"):
            all_names = True
        elif a in ("-n", "--dry-run"):
            dry = True
        elif a.startswith("-"):
            continue  # -v, -b, -s ...: no effect on the simulation
        else:
            words.append(a)
    if not words:
        err("modprobe: ERROR: missing parameters. See -h.")
        return 1
    names, params = (words, []) if all_names or remove else (words[:1], words[1:])
    code = 0
    conf = hw.modprobe_conf()
    for name in names:
        if dry:
            if not hw.module_exists(name):
                err(
                    f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{hw.kernel}"
                )
                code = 1
            continue
        ok, message = hw.unload(name) if remove else hw.load(name, params, conf)
        if not ok:
            code = 1
            if not quiet or "not found" not in message:
                err(message)
    hw.write_views()
    hw.save()
    return code


def kmod_binary(hw_root: Path) -> str:
    for candidate in (
        hw_root / "usr/bin/kmod",
        hw_root / "bin/kmod",
        Path("/usr/bin/kmod"),
        Path("/bin/kmod"),
    ):
        if candidate.exists():
            return str(candidate)
    return "kmod"


def modinfo(argv: list[str]) -> int:
    """Real kmod modinfo on the real .ko, with names resolved against the simulated kernel."""
    hw = load_hw()
    args, target, kver = [], None, None
    it = iter(argv)
    for a in it:
        if a in ("-k", "--set-version"):
            kver = next(it, None)
        elif a in ("-F", "--field", "-b", "--basedir"):
            args += [a, next(it, "")]
        elif a.startswith("-"):
            args.append(a)
        else:
            target = a
    if target is None:
        err("modinfo: ERROR: missing module or filename.")
        return 1
    path = Path(target)
    if "/" not in target and not target.endswith(".ko") and hw is not None:
        kver = kver or hw.kernel
        ko = hw.find_ko(target, kver)
        if (
            ko is None
            and hwsim.norm(target) in hwsim.IN_TREE
            and hw.p(f"lib/modules/{kver}").is_dir()
        ):
            return modinfo_intree(hwsim.norm(target), kver, hw, args)
        if ko is None:
            err(f"modinfo: ERROR: Module {target} not found.")
            return 1
        path = ko
    elif hw is not None and not path.is_absolute():
        path = Path.cwd() / path
    kmod = kmod_binary(hw.root if hw else root())
    import subprocess

    proc = subprocess.run(
        ["modinfo", *args, str(path)],
        executable=kmod,
        capture_output=True,
        text=True,
        env=dict(os.environ, LC_ALL="C"),
        check=False,
    )
    prefix = str(hw.root).rstrip("/") if hw else ""
    text = proc.stdout.replace(prefix + "/lib/modules/", "/lib/modules/") if prefix else proc.stdout
    out(text)
    sys.stderr.write(proc.stderr)
    return proc.returncode


def modinfo_intree(name: str, kver: str, hw: hwsim.Hw, args: list[str]) -> int:
    """In-tree modules exist only in the catalogue: the fields modinfo would show (constructed)."""
    mod = hwsim.IN_TREE[name]
    fields = [
        ("filename", f"/lib/modules/{kver}/{mod['path']}"),
        ("description", mod["desc"]),
        ("license", "GPL v2"),
        ("depends", ",".join(mod["deps"])),
        ("retpoline", "Y"),
        ("intree", "Y"),
        ("name", name),
        ("vermagic", hw.kernel_info(kver)["vermagic"] + " "),
    ]
    fields += [("parm", f"{p}:(bool)") for p in mod["params"]]
    if "-F" in args:
        want = args[args.index("-F") + 1]
        out("".join(v + "\n" for k, v in fields if k == want))
        return 0
    out("".join(f"{k + ':':<16}{v}\n" for k, v in fields))
    return 0


def depmod(argv: list[str]) -> int:
    """Real depmod, defaulting to the simulated kernel (the real one would ask the host's uname)."""
    hw = load_hw()
    args = list(argv)
    if hw and hw.kernel and not any(re.match(r"^\d+\.\d+", a) for a in args):
        args.append(hw.kernel)
    kmod = kmod_binary(hw.root if hw else root())
    os.execv(kmod, ["depmod", *args])
    return 1  # pragma: no cover


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


def uname(argv: list[str]) -> int:
    hw = load_hw()
    if hw is None or not hw.kernel:
        real = (
            "/usr/bin/uname.distrib"
            if Path("/usr/bin/uname.distrib").exists()
            else "/bin/uname.distrib"
        )
        os.execv(real, ["uname", *argv])
    info = hw.kernel_info(hw.kernel)
    hostname = hw.p("etc/hostname")
    node = hostname.read_text().strip() if hostname.exists() else hw.profile["hostname"]
    parts = {
        "s": "Linux",
        "n": node,
        "r": hw.kernel,
        "v": info["build"],
        "m": "x86_64",
        "p": "unknown",
        "i": "unknown",
        "o": "GNU/Linux",
    }
    long = {
        "--kernel-name": "s",
        "--nodename": "n",
        "--kernel-release": "r",
        "--kernel-version": "v",
        "--machine": "m",
        "--processor": "p",
        "--hardware-platform": "i",
        "--operating-system": "o",
    }
    wanted: list[str] = []
    for a in argv:
        if a in ("-a", "--all"):
            wanted += ["s", "n", "r", "v", "m", "o"]  # GNU omits unknown -p/-i from -a
        elif a in long:
            wanted.append(long[a])
        elif a.startswith("-") and not a.startswith("--") and set(a[1:]) <= set(parts):
            wanted += list(a[1:])
        else:
            err(
                f"uname: invalid option -- '{a.lstrip('-')[:1]}'\nTry 'uname --help' for more information."
            )
            return 1
    order = "snrvmpio"
    picked = sorted(set(wanted or ["s"]), key=order.index)
    out(" ".join(parts[k] for k in picked) + "\n")
    return 0


def dmesg(argv: list[str]) -> int:
    """The simulated kernel's log (the real dmesg in a chroot would show the host's)."""
    hw = load_hw()
    log = hw.p(hwsim.DMESG) if hw else None
    if log is None or not log.exists():
        return 0
    text = log.read_text()
    if "-c" in argv or "--read-clear" in argv:
        log.write_text("")
    out(text)
    return 0


TOOLS = {
    "nvidia-smi": nvidia_smi,
    "dmesg": dmesg,
    "lspci": lspci,
    "lsmod": lsmod,
    "modprobe": modprobe,
    "modinfo": modinfo,
    "depmod": depmod,
    "nvidia-modprobe": nvidia_modprobe,
    "uname": uname,
}


MUTATING = ("modprobe", "nvidia-modprobe")


def main(tool: str, argv: list[str]) -> int:
    if tool in MUTATING:
        with hwsim.locked(root()):
            return TOOLS[tool](argv)
    return TOOLS[tool](argv)


if __name__ == "__main__":  # python3 twin_hwshim.py TOOL ARGS...
    sys.exit(main(sys.argv[1], sys.argv[2:]))
