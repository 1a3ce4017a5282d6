"""PCI passthrough at VM start and stop, as qemu-server 8.4 does it (stdlib only).

Sources: qemu-server PVE/QemuServer/PCI.pm (parse_hostpci, parse_hostpci_devices,
choose_hostpci_devices, prepare_pci_device, reserve_pci_usage, remove_pci_reservation),
PVE/QemuServer.pm (vm_start_nolock, cleanup_pci_devices) and pve-common PVE/SysFSTools.pm
(lspci, pci_device_info, check_iommu_support, pci_dev_bind_to_vfio,
pci_dev_group_bind_to_vfio). What start does to the host, in order:
  1. parse every hostpciN: `mapping=` is resolved for this node from /etc/pve/mapping/pci.cfg and
     checked against the live device (mapping.assert_valid); each id must exist in sysfs; pcie=1
     needs a q35 machine (the die without newline gets Perl's " at ... line 501." suffix);
  2. reserve every function in /run/qemu-server/pci-id-reservations ("PCI device 'X' already in
     use by VMID 'N'" while that VM runs);
  3. per function: "cannot prepare PCI pass-through, IOMMU not present" unless the IOMMU is on;
     then the whole IOMMU group (bridges skipped) goes to vfio-pci: write "vendor device" to
     vfio-pci/new_id (the kernel then probes EVERY unbound device with that id: identical
     boards that have no driver are captured too), unbind the function from its driver, bind it
     to vfio-pci. qemu-server never gives a device back to its old driver at stop.
A function the nvidia driver holds open (a running container with its /dev/nvidiaN node, or
nvidia-persistenced) cannot be unbound cleanly: nv_pci_remove() logs "NVRM: Attempting to remove
device ... with non-zero usage count!" and waits until the users close it, so the write to
`unbind` blocks and the start task stays `running` until the holder goes away (the twin gives
up after UNBIND_WAIT_S and fails the task, where a real host would hang on).
The twin's VM does not run QEMU: after these steps it is recorded as running (state only).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import config as cfg
from . import mapping
from . import options as opts
from .guest_state import is_running, running_state
from .schema import FormatError, PveError, parse_property_string
from .tasks import _alive

PCIRE = r"[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}\.[a-f0-9]"
RESERVATIONS = "run/qemu-server/pci-id-reservations"
PCI_PM = "/usr/share/perl5/PVE/QemuServer/PCI.pm"
UNBIND_WAIT_S = float(os.environ.get("TWIN_UNBIND_WAIT_S", "600"))
MAX_HOSTPCI = 16


def _hwsim():  # type: ignore[no-untyped-def]
    """The hardware simulation: `twin.hwsim` outside the twin, `hwsim` inside it."""
    try:
        from twin import hwsim  # type: ignore[import-not-found]
    except ImportError:
        import hwsim  # type: ignore[import-not-found,no-redef]
    return hwsim


@dataclass
class PciDev:
    id: str  # full BDF, 0000:41:00.0
    vendor: str  # 0x10de
    device: str


@dataclass
class HostPci:
    opt: str
    values: dict[str, str]
    alternatives: list[list[PciDev]] = field(default_factory=list)
    ids: list[PciDev] = field(default_factory=list)  # the chosen alternative


def _read(path: Path) -> str | None:
    try:
        return path.read_text().splitlines()[0].strip()
    except (FileNotFoundError, IndexError, NotADirectoryError):
        return None


def lspci(root: Path, filt: str) -> list[PciDev]:
    """SysFSTools::lspci with a string filter: ids starting with it (domain optional)."""
    devices = root / "sys/bus/pci/devices"
    found = []
    for entry in sorted(devices.iterdir()) if devices.is_dir() else []:
        if not re.fullmatch(PCIRE, entry.name):
            continue
        if not re.match(rf"(0000:)?{re.escape(filt)}", entry.name):
            continue
        found.append(
            PciDev(entry.name, _read(entry / "vendor") or "", _read(entry / "device") or "")
        )
    return found


def device_info(root: Path, bdf: str) -> dict[str, object] | None:
    """SysFSTools::pci_device_info($name, 1): None unless irq, vendor and device read."""
    if not re.fullmatch(PCIRE, bdf):
        return None
    d = root / "sys/bus/pci/devices" / bdf
    irq, vendor, device = _read(d / "irq"), _read(d / "vendor"), _read(d / "device")
    if irq is None or not irq.isdigit() or not vendor or not device:
        return None
    if not vendor.startswith("0x") or not device.startswith("0x"):
        return None
    info: dict[str, object] = {"name": bdf, "vendor": vendor[2:], "device": device[2:]}
    for key in ("subsystem_vendor", "subsystem_device"):
        value = _read(d / key)
        if value is not None:
            info[key] = value.removeprefix("0x")
    group = d / "iommu_group"
    if group.is_symlink():
        m = re.search(r"/(\d+)$", os.readlink(group))
        if m:
            info["iommugroup"] = int(m.group(1))
    info["mdev"] = (d / "mdev_supported_types").is_dir() or (d / "nvidia").is_dir()
    return info


def parse_hostpci(root: Path, opt: str, value: str) -> HostPci:
    """PCI.pm parse_hostpci."""
    try:
        res = parse_property_string(opts.HOSTPCI_FMT, value)
    except FormatError as exc:
        raise PveError(f"unable to parse value of '{opt}' - {exc}") from None
    host, name = res.pop("host", None), res.pop("mapping", None)
    if host is not None and name is not None:
        raise PveError("Cannot set both 'host' and 'mapping'.")
    alternatives: list[list[str]] = []
    if name:
        entries = mapping.find_on_node(root, name, cfg.node_name(root))
        if not entries:
            raise PveError(f"PCI device mapping not found for '{name}'")
        cluster = mapping.load(root).get(name, {})
        for entry in entries:
            try:
                mapping.assert_valid(root, name, entry, cluster)
            except PveError as exc:
                raise PveError(
                    f"PCI device mapping invalid (hardware probably changed): {exc.msg}\n"
                ) from None
            alternatives.append(entry["path"].split(";"))
    elif host:
        alternatives.append(host.split(";"))
    else:
        raise PveError("Either 'host' or 'mapping' must be set.")
    parsed = HostPci(opt, res)
    for alternative in alternatives:
        ids: list[PciDev] = []
        for pciid in alternative:
            devs = lspci(root, pciid)
            if not devs:
                raise PveError(f"no PCI device found for '{pciid}'")
            ids += devs
        if len(ids) > 1 and res.get("mdev"):
            raise PveError("cannot use mediated device with multifunction device")
        parsed.alternatives.append(ids)
    return parsed


def parse_hostpci_devices(root: Path, values: dict[str, str]) -> dict[str, HostPci]:
    """PCI.pm parse_hostpci_devices: q35 is checked here, before anything is reserved."""
    machine = values.get("machine", "")
    q35 = "q35" in machine.split(",")[0]
    devices = {}
    for i in range(MAX_HOSTPCI):
        opt = f"hostpci{i}"
        if not values.get(opt):
            continue
        d = parse_hostpci(root, opt, values[opt])
        if not q35 and d.values.get("pcie") == "1":
            # a die without "\n": Perl appends where it died
            raise PveError(f"q35 machine model is not enabled at {PCI_PM} line 501.")
        devices[opt] = d
    return devices


# --- reservations (PCI.pm reserve_pci_usage / remove_pci_reservation) ---


def _reservations(root: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    try:
        lines = (root / RESERVATIONS).read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        m = re.fullmatch(rf"({PCIRE})\s(\d+)\s(time|pid):(\d+)", line)
        if m:
            out[m.group(1)] = {"vmid": int(m.group(2)), m.group(3): int(m.group(4))}
    return out


def _write_reservations(root: Path, res: dict[str, dict[str, int]]) -> None:
    path = root / RESERVATIONS
    path.parent.mkdir(parents=True, exist_ok=True)
    text = ""
    for pciid in sorted(res):
        r = res[pciid]
        text += f"{pciid} {r['vmid']} " + (f"pid:{r['pid']}" if "pid" in r else f"time:{r['time']}")
        text += "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _vm_pid(root: Path, vmid: int) -> int | None:
    state = running_state(root, "qemu", vmid)
    pid = state.get("pid") if state else None
    return pid if isinstance(pid, int) else None


def reserve(root: Path, ids: list[str], vmid: int, timeout: int | None, pid: int | None,
            warn: Callable[[str], None]) -> None:  # fmt: skip
    """reserve_pci_usage: a time-limited reservation before start, the PID once running."""
    with _hwsim().locked(root):
        res = _reservations(root)
        now = int(time.time())
        for pciid in ids:
            r = res.get(pciid)
            if r and r["vmid"] != vmid:
                if "time" in r and r["time"] > now:
                    raise PveError(
                        f"PCI device '{pciid}' is currently reserved for use by VMID '{r['vmid']}'"
                    )
                if "pid" in r:
                    if _vm_pid(root, r["vmid"]) == r["pid"]:
                        raise PveError(f"PCI device '{pciid}' already in use by VMID '{r['vmid']}'")
                    warn(f"leftover PCI reservation found for {pciid}, lets take it...")
            res[pciid] = {"vmid": vmid}
            if pid is not None:
                res[pciid]["pid"] = pid
            elif timeout is not None:
                res[pciid]["time"] = now + timeout + 5
        _write_reservations(root, res)


def remove_reservation(root: Path, vmid: int) -> None:
    """cleanup_pci_devices → remove_pci_reservation($vmid): at stop, or when start failed."""
    with _hwsim().locked(root):
        res = _reservations(root)
        _write_reservations(root, {k: v for k, v in res.items() if v["vmid"] != vmid})


# --- binding to vfio-pci (SysFSTools pci_dev_group_bind_to_vfio / pci_dev_bind_to_vfio) ---


def holders(root: Path, bdf: str) -> list[str]:
    """Who keeps an nvidia-bound GPU open: running containers granted its /dev/nvidiaN node
    (devN or a bind mount entry), and a running nvidia-persistenced (it opens every GPU)."""
    hw = _hwsim().Hw(root)
    minor = next((g["minor"] for g in hw.nvidia_gpus() if g["bdf"] == bdf), None)
    if minor is None:
        return []
    node = f"/dev/nvidia{minor}"
    found = []
    for ctid in cfg.guest_ids(root, "lxc"):
        if not is_running(root, "lxc", ctid):
            continue
        try:
            conf = cfg.load_config(root, "lxc", ctid).main
        except PveError:
            continue
        devs = [v.split(",")[0].removeprefix("path=") for k, v in conf.values.items()
                if re.fullmatch(r"dev\d+", k)]  # fmt: skip
        mounts = [v.split()[0] for k, v in conf.lxc if k == "lxc.mount.entry" and v.split()]
        if node in devs or node in mounts:
            found.append(f"CT {ctid}")
    pidfile = root / "var/run/nvidia-persistenced/nvidia-persistenced.pid"
    pid = _read(pidfile)
    if pid and pid.isdigit() and _alive(int(pid)):
        found.append("nvidia-persistenced")
    return found

    return True


def bind_group_to_vfio(root: Path, bdf: str, log: Callable[[str], None]) -> None:
    """pci_dev_group_bind_to_vfio: every non-bridge device of the group goes to vfio-pci."""
    hwsim = _hwsim()
    with hwsim.locked(root):
        hw = hwsim.Hw(root)
        if not hw.loaded("vfio_pci"):  # system("/sbin/modprobe vfio-pci")
            hw.load("vfio_pci")
            hw.write_views()
            hw.save()
        if not hw.loaded("vfio_pci"):
            raise PveError("Cannot find vfio-pci module!")
    group = root / "sys/bus/pci/devices" / bdf / "iommu_group/devices"
    if not group.is_dir():
        raise PveError("Cannot open iommu_group: No such file or directory")
    for member in sorted(p.name for p in group.iterdir()):
        devices = _hwsim().Hw(root).devices()
        if devices.get(member, {}).get("class", "").startswith("0604"):
            continue  # bridges and root ports (they have a pci_bus dir) are skipped
        if not _bind_to_vfio(root, member, log):
            raise PveError(f"Cannot bind {member} to vfio")


def _bind_to_vfio(root: Path, bdf: str, log: Callable[[str], None]) -> bool:
    """pci_dev_bind_to_vfio: new_id, unbind from the current driver, bind to vfio-pci."""
    hwsim = _hwsim()
    info = device_info(root, bdf)
    if info is None:
        return False
    with hwsim.locked(root):
        hw = hwsim.Hw(root)
        if hw.state.get("bindings", {}).get(bdf) == "vfio-pci":
            return True
        captured = hwsim.add_new_id(hw, "vfio-pci", str(info["vendor"]), str(info["device"]))
        for other in captured or []:
            hw.klog(f"vfio-pci {other}: bound by new_id {info['vendor']} {info['device']}")
        driver = hw.state.get("bindings", {}).get(bdf)
        _commit(hw)
    if driver == "nvidia":
        _wait_for_release(root, bdf, log)
    with hwsim.locked(root):
        hw = hwsim.Hw(root)
        if hw.state.get("bindings", {}).get(bdf) not in (None, "vfio-pci"):
            hwsim.unbind_device(hw, bdf)
        ok = hw.state["bindings"].get(bdf) == "vfio-pci" or hwsim.bind_device(hw, "vfio-pci", bdf)
        _commit(hw)
    return ok


def _commit(hw: object) -> None:
    hw.write_views()  # type: ignore[attr-defined]
    hw.save()  # type: ignore[attr-defined]


def _wait_for_release(root: Path, bdf: str, log: Callable[[str], None]) -> None:
    """nv_pci_remove with a non-zero usage count: wait (0.5 s steps) until nobody holds it."""
    held = holders(root, bdf)
    if not held:
        return
    hwsim = _hwsim()
    with hwsim.locked(root):
        hw = hwsim.Hw(root)
        hw.klog(f"NVRM: Attempting to remove device {bdf} with non-zero usage count!")
        hw.save()
    log(f"twin: unbinding {bdf} from nvidia waits for {', '.join(held)}")
    deadline = time.monotonic() + UNBIND_WAIT_S
    while holders(root, bdf):
        if time.monotonic() > deadline:
            raise PveError(
                f"twin: unbinding {bdf} from nvidia still blocked after {UNBIND_WAIT_S:g} s "
                f"(held by {', '.join(holders(root, bdf))}); a real host would hang here"
            )
        time.sleep(0.5)


def iommu_present(root: Path) -> bool:
    """check_iommu_support: /sys/class/iommu/ populated; the twin's state says whether the
    booted kernel enabled the IOMMU."""
    entries = root / "sys/class/iommu"
    if entries.is_dir() and any(not p.name.startswith(".") for p in entries.iterdir()):
        return True
    try:
        return bool(_hwsim().Hw(root).state.get("iommu"))
    except (FileNotFoundError, ValueError):
        return False


def start_devices(root: Path, vmid: int, values: dict[str, str],
                  warn: Callable[[str], None], log: Callable[[str], None]) -> list[str]:  # fmt: skip
    """vm_start_nolock's PCI part: parse, choose, reserve, prepare. Returns the reserved ids."""
    devices = parse_hostpci_devices(root, values)
    used: set[str] = set()
    for opt in sorted(devices, key=lambda k: int(k[7:])):
        d = devices[opt]
        d.ids = d.alternatives[0]
        if len(d.alternatives) > 1:  # the first alternative nobody uses or reserved
            res = _reservations(root)
            free = [
                alt for alt in d.alternatives
                if not any(p.id in used or (p.id in res and res[p.id]["vmid"] != vmid
                                            and _vm_pid(root, res[p.id]["vmid"]) is not None)
                           for p in alt)
            ]  # fmt: skip
            if not free:
                raise PveError(f"could not find a free device for '{opt}'")
            d.ids = free[0]
        for p in d.ids:
            if p.id in used:
                raise PveError(f"device '{p.id}' assigned more than once")
            used.add(p.id)
    ids = [p.id for d in devices.values() for p in d.ids]
    reserve(root, ids, vmid, timeout=30, pid=None, warn=warn)
    try:
        for opt in sorted(devices):
            for p in devices[opt].ids:  # prepare_pci_device
                info = device_info(root, p.id)
                if not iommu_present(root):
                    raise PveError("cannot prepare PCI pass-through, IOMMU not present")
                if info is None:
                    raise PveError(f"no pci device info for device '{p.id}'")
                if not devices[opt].values.get("mdev"):
                    bind_group_to_vfio(root, p.id, log)
    except PveError:
        remove_reservation(root, vmid)
        raise
    return ids
