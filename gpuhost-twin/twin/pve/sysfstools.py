"""PCI devices in sysfs as qemu-server reaches them: pve-common PVE/SysFSTools.pm (stdlib only).

lspci, pci_device_info and check_iommu_support read the PCI devices; pci_dev_group_bind_to_vfio
and pci_dev_bind_to_vfio hand a function's whole IOMMU group to vfio-pci: write "vendor device" to
vfio-pci/new_id (the kernel then probes EVERY unbound device with that id: identical boards that
have no driver are captured too), unbind the function from its driver, bind it to vfio-pci.
A function the nvidia driver holds open (a running container with its /dev/nvidiaN node, or
nvidia-persistenced) cannot be unbound cleanly: nv_pci_remove() logs "NVRM: Attempting to remove
device ... with non-zero usage count!" and waits until the users close it, so the write to
`unbind` blocks and the start task stays `running` until the holder goes away (the twin gives
up after UNBIND_WAIT_S and fails the task, where a real host would hang on).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import config as cfg
from .guest_state import is_running
from .schema import PveError
from .tasks import _alive

PCIRE = r"[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}\.[a-f0-9]"
UNBIND_WAIT_S = float(os.environ.get("TWIN_UNBIND_WAIT_S", "600"))


def simulation():  # type: ignore[no-untyped-def]
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


def iommu_present(root: Path) -> bool:
    """check_iommu_support: /sys/class/iommu/ populated; the twin's state says whether the
    booted kernel enabled the IOMMU."""
    entries = root / "sys/class/iommu"
    if entries.is_dir() and any(not p.name.startswith(".") for p in entries.iterdir()):
        return True
    try:
        return bool(simulation().Hw(root).state.get("iommu"))
    except (FileNotFoundError, ValueError):
        return False


# --- binding to vfio-pci (pci_dev_group_bind_to_vfio / pci_dev_bind_to_vfio) ---


def holders(root: Path, bdf: str) -> list[str]:
    """Who keeps an nvidia-bound GPU open: running containers granted its /dev/nvidiaN node
    (devN or a bind mount entry), and a running nvidia-persistenced (it opens every GPU)."""
    hw = simulation().Hw(root)
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


def bind_group_to_vfio(root: Path, bdf: str, log: Callable[[str], None]) -> None:
    """pci_dev_group_bind_to_vfio: every non-bridge device of the group goes to vfio-pci."""
    hwsim = simulation()
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
        devices = simulation().Hw(root).devices()
        if devices.get(member, {}).get("class", "").startswith("0604"):
            continue  # bridges and root ports (they have a pci_bus dir) are skipped
        if not _bind_to_vfio(root, member, log):
            raise PveError(f"Cannot bind {member} to vfio")


def _bind_to_vfio(root: Path, bdf: str, log: Callable[[str], None]) -> bool:
    """pci_dev_bind_to_vfio: new_id, unbind from the current driver, bind to vfio-pci."""
    hwsim = simulation()
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
    hwsim = simulation()
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
