"""PCI devices in sysfs: the tree and IOMMU groups at boot, which driver binds which device
(driver_override first, like the kernel), and the bind/unbind/drivers_probe control files.

Each function's `config` is its configuration space as the kernel reads it live (the first 16
bytes of the header; all ones, vendor id 0xffff, once the function no longer answers: see
PciBinding.fall_off_bus). Where the profile lists reset methods, `reset_method` shows them and
`reset` takes a function reset; elsewhere neither file exists (Documentation/ABI/testing/
sysfs-bus-pci: "For devices that have this support, a file named reset_method will be
present"; the kernel hides `reset` too when no method is supported)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from . import sysfs_ctl
from .catalog import BRIDGE_DRIVER
from .kofile import norm
from .machine import Machine, remove_tree


class PciBinding(Machine):
    """Driver binding per BDF (a part of Hw)."""

    # What binding needs of KernelViews, the part of Hw that shows the state: declared here,
    # defined there (Hw mixes both in).
    nvidia_gpus: Callable[[], list[dict]]
    write_views: Callable[[], None]

    def apply_writes(self) -> bool:
        """Apply pending writes to the sysfs control files (see _apply_sysfs_writes)."""
        return _apply_sysfs_writes(self)

    def fall_off_bus(self, bdf: str) -> None:
        """A fault: the function stops answering, so config reads return all ones (as after a
        hung device or a surprise link down); a function reset cannot bring it back."""
        lost = self.state.setdefault("config_lost", [])
        if bdf not in lost:
            lost.append(bdf)
        write_config(self, bdf)

    def gpu_holders(self, bdf: str) -> list[int]:
        """Processes of the machine that hold this GPU's /dev/nvidiaN open (any node of major
        195 and its minor: a container's own node counts too), read through /proc/<pid>/fd."""
        minor = next((g["minor"] for g in self.nvidia_gpus() if g["bdf"] == bdf), None)
        if minor is None:
            return []
        wanted = os.makedev(195, minor)
        holders = []
        proc = self.p("proc")
        for entry in os.scandir(proc) if proc.is_dir() else []:
            if not entry.name.isdigit():
                continue
            try:
                target = os.readlink(entry.path) if entry.is_symlink() else None
                fds = self.p(target) / "fd" if target else Path(entry.path) / "fd"
                for fd in os.scandir(fds):
                    st = os.stat(fd.path)
                    if stat.S_ISCHR(st.st_mode) and st.st_rdev == wanted:
                        holders.append(int(entry.name))
                        break
            except OSError:
                continue
        return holders

    def driver_override(self, bdf: str) -> str | None:
        f = self.p(f"sys/bus/pci/devices/{bdf}/driver_override")
        value = f.read_text().strip() if f.exists() else "(null)"
        return None if value in ("", "(null)") else value

    def bind_all(self, driver: str, ids: list[str] | None = None) -> list[str]:
        """Probe every unbound device the driver may take (driver_override first, like the kernel)."""
        bindings = self.state.setdefault("bindings", {})
        bound = []
        for bdf, dev in sorted(self.devices().items()):
            if bindings.get(bdf):
                continue
            override = self.driver_override(bdf)
            if override is not None:
                wants = override == driver
            elif driver == "nvidia":
                wants = dev["vendor"] == "10de" and dev["class"].startswith("03")
            elif driver == "vfio-pci":
                wants = f"{dev['vendor']}:{dev['device']}" in (ids or [])
            else:
                wants = dev.get("driver") == driver
            if not wants:
                continue
            if driver == "vfio-pci" and not self._group_of(bdf):
                self.klog(f"vfio-pci: probe of {bdf} failed with error -22")
                continue
            if driver == "nvidia" and not self._nvidia_probe(bdf, dev):
                continue
            bindings[bdf] = driver
            bound.append(bdf)
        return bound

    def _nvidia_probe(self, bdf: str, dev: dict) -> bool:
        gpu = next((g for g in self.gpus() if g["bdf"] == bdf), None)
        if gpu is None:
            return False
        if bdf in self.state.get("config_lost", []):  # the twin's fault: nothing answers
            self.klog(f"NVRM: GPU {bdf}: RmInitAdapter failed! (0x22:0x56:667)")
            self.klog(f"NVRM: GPU {bdf}: rm_init_adapter failed, device minor number -1")
            return False
        if gpu["architecture"] == "Blackwell" and not self.state["nvidia"].get("open"):
            self.klog(
                f"NVRM: The NVIDIA GPU {bdf} (PCI ID: {dev['vendor']}:{dev['device']})\n"
                "NVRM: installed in this system requires use of the NVIDIA open kernel modules."
            )
            return False
        failed = self.state.setdefault("gpu_failed", {})
        failed.pop(bdf, None)
        # Seen on the operator's host only with SEV-SNP on in firmware; without SNP, iommu=pt
        # with Blackwell on the host driver worked (docs/hazards.md).
        if (
            gpu.get("fsp_fails_on_identity")
            and self.state.get("sev_snp_firmware")
            and self.group_type(bdf) == "identity"
        ):
            # The device stays bound (probe succeeds); RM init fails, so NVML cannot see it.
            self.klog(f"NVRM: GPU {bdf}: kfspWaitForSecureBoot_GH100: FSP boot failed, error 0x177")
            self.klog(f"NVRM: GPU {bdf}: RmInitAdapter failed! (0x62:0x177:2131)")
            failed[bdf] = "FSP boot failed (error 0x177) under an identity IOMMU domain"
        return True

    def _group_of(self, bdf: str) -> int | None:
        return self.state.get("groups", {}).get(bdf)

    def group_type(self, bdf: str) -> str | None:
        group = self._group_of(bdf)
        if group is None:
            return None
        f = self.p(f"sys/kernel/iommu_groups/{group}/type")
        return f.read_text().strip() if f.exists() else self.state.get("iommu_domain")


def sysfs_path(devices: dict[str, dict], bdf: str) -> str:
    """sys/devices/pci<dom>:<bus>/<upstream bridges...>/<bdf>, following parent links."""
    chain = [bdf]
    while devices[chain[-1]].get("parent"):
        chain.append(devices[chain[-1]]["parent"])
    chain.reverse()
    return f"sys/devices/pci{chain[0][:7]}/" + "/".join(chain)


def layout_pci(hw: PciBinding) -> None:
    """Fresh PCI sysfs: device dirs, bus links, IOMMU groups; bridges bound to pcieport."""
    for tree in ("sys/bus/pci", "sys/kernel/iommu_groups"):
        remove_tree(hw.p(tree))
    for top in hw.p("sys/devices").glob("pci*") if hw.p("sys/devices").is_dir() else []:
        remove_tree(top)
    devices = hw.devices()
    groups = hw.state.get("groups", {})
    paths = {bdf: sysfs_path(devices, bdf) for bdf in devices}
    hw.state["sysfs_paths"] = paths
    bus_devices = hw.p("sys/bus/pci/devices")
    bus_devices.mkdir(parents=True)
    live = bool(hw.state.get("live_sysfs"))
    sysfs_ctl.make(hw.p("sys/bus/pci/drivers_probe"), live)
    hw.write("sys/bus/pci/rescan", "", 0o200)
    bindings = hw.state.setdefault("bindings", {})
    for bdf, dev in sorted(devices.items()):
        d = paths[bdf]
        cls = dev["class"]
        modalias = (
            f"pci:v0000{dev['vendor']}d0000{dev['device']}sv0000{dev['subsystem_vendor']}"
            f"sd0000{dev['subsystem_device']}bc{cls[:2]}sc{cls[2:4]}i{cls[4:]}"
        ).upper()
        devdir = hw.p(d)
        devdir.mkdir(parents=True, exist_ok=True)
        for name, value in (
            ("vendor", f"0x{dev['vendor']}"),
            ("device", f"0x{dev['device']}"),
            ("class", f"0x{cls}"),
            ("subsystem_vendor", f"0x{dev['subsystem_vendor']}"),
            ("subsystem_device", f"0x{dev['subsystem_device']}"),
            ("revision", f"0x{dev['revision']}"),
            ("numa_node", str(dev["numa_node"])),
            ("irq", str(dev["irq"])),
            ("modalias", modalias.replace("PCI:", "pci:")),
            ("enable", "1"),
            ("driver_override", "(null)"),
        ):
            (devdir / name).write_text(value + "\n")  # a fresh tree: no need for atomic writes
        for ctl in ("remove", "rescan"):
            (devdir / ctl).write_text("")
        if dev.get("reset_methods"):
            (devdir / "reset_method").write_text(" ".join(dev["reset_methods"]) + "\n")
            sysfs_ctl.make(devdir / "reset", live)
        write_config(hw, bdf, devdir)
        os.symlink(os.path.relpath(devdir, bus_devices), bus_devices / bdf)
        group = groups.get(bdf)
        if group is not None:
            gdir = hw.p(f"sys/kernel/iommu_groups/{group}")
            (gdir / "devices").mkdir(parents=True, exist_ok=True)
            if not (gdir / "type").exists():
                hw.write(f"sys/kernel/iommu_groups/{group}/type", hw.state["iommu_domain"] + "\n")
            os.symlink(os.path.relpath(gdir, devdir), devdir / "iommu_group")
            os.symlink(os.path.relpath(devdir, gdir / "devices"), gdir / "devices" / bdf)
        bindings[bdf] = BRIDGE_DRIVER if dev.get("driver") == BRIDGE_DRIVER else None


def write_config(hw: PciBinding, bdf: str, devdir: Path | None = None) -> None:
    """The function's config space header (type 0, little endian), or all ones when lost."""
    dev = hw.devices()[bdf]
    if devdir is None:
        devdir = hw.p(hw.state["sysfs_paths"][bdf])
    if bdf in hw.state.get("config_lost", []):
        data = b"\xff" * 16
    else:
        cls = bytes.fromhex(dev["class"])[::-1]  # prog-if, subclass, base class
        data = (
            bytes.fromhex(dev["vendor"])[::-1]
            + bytes.fromhex(dev["device"])[::-1]
            + b"\x00\x00\x10\x00"  # command, status (capability list)
            + bytes.fromhex(dev["revision"])
            + cls
            + b"\x00\x00\x00\x00"  # cache line, latency timer, header type 0, BIST
        )
    (devdir / "config").write_bytes(data)


def _apply_resets(hw: PciBinding) -> bool:
    """`echo 1 > devices/BDF/reset` (reset_store -> pci_reset_function): recorded in order with
    the driver bound at the time, for tests to see that a reset came before a probe."""
    changed = False
    for bdf in sorted(hw.devices()):
        path = hw.p(f"sys/bus/pci/devices/{bdf}/reset")
        if not path.exists() or not sysfs_ctl.drain(path):
            continue
        driver = hw.state.setdefault("bindings", {}).get(bdf)
        hw.state.setdefault("resets", []).append([bdf, driver])
        changed = True
    return changed


def _apply_sysfs_writes(hw: PciBinding) -> bool:
    """Apply what was written to the sysfs control files (bind/unbind/drivers_probe), in order.

    Nothing reacts to a write by itself: the boot, the shims and the supervisor's tick call
    this; each request is applied once (sysfs_ctl). True if anything changed.
    """
    changed = _apply_resets(hw)  # written before any unbind in the same batch: first
    drivers = hw.p("sys/bus/pci/drivers")
    bindings = hw.state.setdefault("bindings", {})
    # unbinds nvidia's remove still waits on (a process held the GPU), retried first
    requests: list[tuple[str, str, str]] = [
        ("unbind", "nvidia", bdf) for bdf in hw.state.get("remove_waiting", [])
    ]
    for ddir in sorted(drivers.iterdir()) if drivers.is_dir() else []:
        for ctl in ("unbind", "bind"):
            requests += [(ctl, ddir.name, bdf) for bdf in sysfs_ctl.drain(ddir / ctl)]
    probes = sysfs_ctl.drain(hw.p("sys/bus/pci/drivers_probe"))
    waiting = hw.state.setdefault("remove_waiting", [])
    for ctl, driver, bdf in requests:
        if bdf not in bindings:
            continue
        if ctl == "unbind" and bindings[bdf] == driver == "nvidia" and hw.gpu_holders(bdf):
            # nv_pci_remove (nv-pci.c) waits, looping on os_delay(500), until the usage count
            # drops to zero: the unbind does not complete while anything holds the GPU open.
            if bdf not in waiting:
                waiting.append(bdf)
                hw.klog(f"NVRM: Attempting to remove device {bdf} with non-zero usage count!")
                changed = True
            continue
        if ctl == "unbind" and bindings[bdf] == driver:
            if bdf in waiting:
                waiting.remove(bdf)
            bindings[bdf], changed = None, True
        elif ctl == "bind" and bindings[bdf] is None:
            override = hw.driver_override(bdf)
            if (override in (None, driver) and hw.loaded(norm(driver))) or driver == BRIDGE_DRIVER:
                bindings[bdf], changed = driver, True
    for bdf in probes:
        if bdf not in bindings or bindings[bdf] is not None:
            continue
        override = hw.driver_override(bdf)
        dev = hw.devices()[bdf]
        if override:  # driver_override decides, and only that driver may take it
            if hw.loaded(norm(override)) and (override != "vfio-pci" or hw._group_of(bdf)):
                bindings[bdf], changed = override, True
        elif dev["vendor"] == "10de" and dev["class"].startswith("03"):
            if hw.loaded("nvidia") and hw._nvidia_probe(bdf, dev):
                bindings[bdf], changed = "nvidia", True
        elif dev.get("driver"):  # the device's own driver (snd_hda_intel...) is there already
            bindings[bdf], changed = dev["driver"], True
    if changed:
        hw.write_views()
        hw.save()
    return changed


# --- runtime rebinding through the driver control files (what qemu-server's SysFSTools writes) ---


def _pci_match(hw: PciBinding, driver: str, bdf: str) -> bool:
    """pci_match_device: driver_override decides when set; else the driver's id tables
    (vfio-pci has only dynamic ids, from new_id)."""
    override = hw.driver_override(bdf)
    if override is not None:
        return override == driver
    dev = hw.devices()[bdf]
    if driver == "vfio-pci":
        return f"{dev['vendor']}:{dev['device']}" in hw.state.get("dynids", {}).get(driver, [])
    if driver == "nvidia":
        return dev["vendor"] == "10de" and dev["class"].startswith("03")
    return dev.get("driver") == driver


def add_new_id(hw: PciBinding, driver: str, vendor: str, device: str) -> list[str] | None:
    """`echo "vvvv dddd" > drivers/<driver>/new_id` (new_id_store): add a dynamic id, then
    driver_attach() probes every device without a driver that now matches, so identical
    unbound boards are all taken. None when the id is there already (-EEXIST)."""
    key = f"{vendor.removeprefix('0x')}:{device.removeprefix('0x')}"
    ids = hw.state.setdefault("dynids", {}).setdefault(driver, [])
    if key in ids:
        return None
    ids.append(key)
    bound = []
    bindings = hw.state.setdefault("bindings", {})
    for bdf in sorted(hw.devices()):
        if bindings.get(bdf) or not _pci_match(hw, driver, bdf):
            continue
        if driver == "vfio-pci" and not hw._group_of(bdf):
            hw.klog(f"vfio-pci: probe of {bdf} failed with error -22")
            continue
        bindings[bdf] = driver
        bound.append(bdf)
    return bound


def unbind_device(hw: PciBinding, bdf: str) -> str | None:
    """`echo BDF > devices/BDF/driver/unbind`: the device loses its driver (returned)."""
    bindings = hw.state.setdefault("bindings", {})
    driver = bindings.get(bdf)
    if driver:
        bindings[bdf] = None
    return driver


def bind_device(hw: PciBinding, driver: str, bdf: str) -> bool:
    """`echo BDF > drivers/<driver>/bind` (bind_store): only a device without a driver that
    the driver matches; vfio-pci also needs an IOMMU group."""
    bindings = hw.state.setdefault("bindings", {})
    if bindings.get(bdf) or not hw.loaded(norm(driver)) or not _pci_match(hw, driver, bdf):
        return False
    if driver == "vfio-pci" and not hw._group_of(bdf):
        hw.klog(f"vfio-pci: probe of {bdf} failed with error -22")
        return False
    bindings[bdf] = driver
    return True
