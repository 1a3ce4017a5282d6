"""lspci, as pciutils 3.9 prints it (docs/reference/formats.md §7): names from the root's pci.ids, -nn/-n, -k,
-v/-vv, -D, -s."""

from __future__ import annotations

from .common import err, hwsim, load_hw, out

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
    """The -v/-vv lines gpuhost reads (constructed from pciutils' format; docs/reference/formats.md §7)."""
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
