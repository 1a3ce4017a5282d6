"""VM boards with a USB-C controller function (class 0c0330, xhci_hcd), claimed at boot.

The twin's profile is kpro6 with a USB 3 controller function on VM 129's two boards (as Turing
boards carry one) and the host's own USB controller, all driven by xhci_pci. Two ways the claim
used to miss, each on its own twin:

- xhci_pci as a module (Proxmox's kernels build it so: pve-kernel debian/rules,
  ``-m CONFIG_USB_XHCI_PCI``): initramfs-tools' MODULES=most copies it into the initramfs, whose
  udev loads it for every USB controller; its install line (the claim) runs there, where no
  vfio module exists unless something adds one. The host's own controller must still get its
  driver in the initramfs (the keyboard at an encryption or emergency prompt).
- xhci_pci built in (listed in modules.builtin, as a kernel built from another config may have
  it): it binds every controller as the bus registers them, before any claim can run. The
  boot unit moves the VM's functions before the guests start.

Either way one run converges (every VM function on vfio-pci, the reboot's confirmation checks
each planned binding) and the next reports zero changes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import deploy, inventory, with_driver
from tests.e2e.test_boot_slice import KPRO6
from tests.e2e.test_vfio_binding import drivers
from twin.profile import PROFILES_DIR

USB_C = ("0000:c1:00.2", "0000:e1:00.2")  # on VM 129's boards
VM_FUNCTIONS = ("0000:c1:00.0", "0000:c1:00.1", *USB_C, "0000:e1:00.0", "0000:e1:00.1")
HOST_USB = "0000:43:00.3"  # the host's own USB controller


def usbc_profile(path: Path) -> Path:
    data = yaml.safe_load((PROFILES_DIR / "kpro6.yaml").read_text())
    data["name"] = "kpro6-usbc"
    devices = data["pci_devices"]
    for bdf in USB_C:
        board = next(d for d in devices if d["bdf"] == bdf[:-1] + "0")
        devices.append(
            {
                **{k: board[k] for k in ("numa_node", "parent", "iommu_group")},
                "bdf": bdf,
                "vendor": "10de",
                "device": "1ad6",
                "class": "0c0330",
                "subsystem_vendor": "10de",
                "subsystem_device": "204b",
                "revision": "a1",
                "driver": "xhci_hcd",
                "modules": ["xhci_pci"],
                "irq": 220,
            }
        )
    devices.append(
        {
            "bdf": HOST_USB,
            "vendor": "1022",
            "device": "15b6",
            "class": "0c0330",
            "subsystem_vendor": "1022",
            "subsystem_device": "15b6",
            "numa_node": 0,
            "parent": "0000:40:03.1",
            "iommu_group": 47,
            "driver": "xhci_hcd",
            "modules": ["xhci_pci"],
            "irq": 70,
        }
    )
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def twins(twin_fleet, modules, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("usbc")
    module_twin, builtin_twin = twin_fleet.start(2, str(usbc_profile(tmp / "kpro6-usbc.yaml")))
    try:
        for twin in (module_twin, builtin_twin):
            kver = with_driver(twin, modules, KPRO6["driver"]["version"])
        listing = builtin_twin.root / f"lib/modules/{kver}/modules.builtin"
        listing.write_text(listing.read_text() + "kernel/drivers/usb/host/xhci-pci.ko\n")
        builtin_twin.reboot()
        assert drivers(builtin_twin, USB_C) == dict.fromkeys(USB_C, "xhci_hcd")
        yield tmp, module_twin, builtin_twin
    finally:
        twin_fleet.stop(module_twin)
        twin_fleet.stop(builtin_twin)


def converges(twin, tmp: Path) -> None:
    """One run makes every planned binding; the next changes nothing."""
    inv = inventory(tmp / f"{twin.name}.py", twin, KPRO6)
    first = deploy(inv)
    assert first.rc == 0, first.output[-4000:]
    assert first.reboots == 1, first.output[-4000:]
    twin.reconnect()
    assert drivers(twin, VM_FUNCTIONS) == dict.fromkeys(VM_FUNCTIONS, "vfio-pci")
    assert drivers(twin, (HOST_USB,)) == {HOST_USB: "xhci_hcd"}
    second = deploy(inv)
    assert second.rc == 0, second.output[-4000:]
    assert not second.changed and second.reboots == 0, second.output[-4000:]


def test_the_claim_inside_the_initramfs_leaves_the_hosts_usb_working(twins) -> None:
    tmp, twin, _ = twins
    converges(twin, tmp)
    state = json.loads(twin.run("cat /var/lib/gpuhost-twin/hw.json")[1])
    # the boot that converged was the trial of the new initramfs, through its own entry; the
    # commit then made the same configuration the kernel's own initramfs (bootcfg below)
    assert state["initramfs"] == "esp entry"
    early = state["initramfs_bindings"]
    assert early.get(HOST_USB) == "xhci_hcd", early  # its driver loaded in the initramfs
    assert {early.get(b) for b in USB_C} == {"vfio-pci"}, early  # and claimed the VM's there
    kver = twin.run("uname -r")[1].strip()
    record = json.loads(twin.run("cat /var/lib/gpuhost-twin/bootcfg.json")[1])["initrd"][kver]
    assert "vfio_pci" in record["modules"]


def test_a_built_in_xhci_driver_is_claimed_at_boot(twins) -> None:
    tmp, _, twin = twins
    converges(twin, tmp)
    rc, out, _ = twin.run("cat /run/gpuhost-twin/systemd/gpuhost-vfio-claim.service.started")
    assert rc == 0, out
