"""What a VM start does to the host's PCI binding (qemu-server PCI.pm prepare_pci_device,
pve-common SysFSTools pci_dev_group_bind_to_vfio): the whole IOMMU group goes to vfio-pci by
writing vendor:device to vfio-pci/new_id, which also captures identical boards that have no
driver; a GPU the nvidia driver holds open cannot be unbound until its user lets go."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from tests.twin.pve_helpers import make_hw_root, run, write_conf
from twin import hwsim
from twin import hwtesting as ht
from twin.pve import tasks

VM = "cores: 4\nmachine: q35\nmemory: 8192\nhostpci0: 0000:41:00,pcie=1\n"
GPUS = ["0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0", "0000:81:00.0"]


def driver(root: Path, bdf: str) -> str | None:
    """The sysfs view: devices/<bdf>/driver -> ../../bus/pci/drivers/<name>."""
    link = root / "sys/bus/pci/devices" / bdf / "driver"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


def test_start_binds_the_group_and_new_id_captures_unbound_twins(tmp_path: Path) -> None:
    root = make_hw_root(tmp_path)  # no nvidia module: every GPU is without a driver
    assert driver(root, "0000:41:00.1") == "snd_hda_intel"
    (root / "sys/bus/pci/devices/0000:81:00.0/driver_override").write_text("nvidia\n")
    write_conf(root, "qemu", 129, VM)
    assert run(root, "qm", "start", "129") == (0, "", "")
    assert driver(root, "0000:41:00.0") == driver(root, "0000:41:00.1") == "vfio-pci"
    # the hazard: new_id 10de:2bb1 took every identical board that had no driver...
    assert [driver(root, g) for g in GPUS] == ["vfio-pci"] * 4 + [None]
    # ...except the one whose driver_override names another driver
    assert "10de:2bb1" in hwsim.Hw(root).state["dynids"]["vfio-pci"]
    assert run(root, "qm", "stop", "129") == (0, "", "")
    assert driver(root, "0000:41:00.0") == "vfio-pci"  # qemu-server never rebinds at stop
    assert (root / "run/qemu-server/pci-id-reservations").read_text() == ""


def test_one_device_for_one_running_vm(tmp_path: Path) -> None:
    root = make_hw_root(tmp_path)
    write_conf(root, "qemu", 129, VM)
    write_conf(root, "qemu", 130, VM)
    assert run(root, "qm", "start", "129")[0] == 0
    assert run(root, "qm", "start", "130") == (
        255,
        "",
        "PCI device '0000:41:00.0' already in use by VMID '129'\n",
    )
    assert run(root, "qm", "stop", "129")[0] == 0
    assert run(root, "qm", "start", "130") == (0, "", "")
    write_conf(root, "qemu", 131, "machine: q35\nlock: backup\nhostpci0: 0000:61:00\n")
    assert run(root, "qm", "start", "131") == (255, "", "VM is locked (backup)\n")


def test_no_iommu_no_passthrough(tmp_path: Path) -> None:
    root = make_hw_root(tmp_path)
    cmdline = root / "etc/kernel/cmdline"
    cmdline.write_text(cmdline.read_text().strip() + " amd_iommu=off\n")
    assert run(root, "proxmox-boot-tool", "refresh")[0] == 0
    ht.boot_root(root, "kpro6")
    assert not hwsim.Hw(root).state["iommu"]
    write_conf(root, "qemu", 129, VM)
    assert run(root, "qm", "start", "129") == (
        255,
        "",
        "cannot prepare PCI pass-through, IOMMU not present\n",
    )
    assert not (root / "run/gpuhost-twin/qemu/129.json").exists()
    assert (root / "run/qemu-server/pci-id-reservations").read_text() == ""  # released again


def test_unbinding_a_gpu_in_use_waits_for_its_user(tmp_path: Path) -> None:
    root = make_hw_root(tmp_path)
    with hwsim.locked(root):  # the state a booted nvidia driver leaves: it bound 41:00.0
        hw = hwsim.Hw(root)
        hw.state["bindings"]["0000:41:00.0"] = "nvidia"
        hw.write_views()
        hw.save()
    assert driver(root, "0000:41:00.0") == "nvidia"
    write_conf(root, "lxc", 200, "arch: amd64\nhostname: ct200\ndev0: /dev/nvidia0\n")
    ct_state = root / "run/gpuhost-twin/ct/200.json"  # what the supervisor writes for a running CT
    ct_state.parent.mkdir(parents=True, exist_ok=True)
    ct_state.write_text(json.dumps({"status": "running"}))
    write_conf(root, "qemu", 129, VM)
    from twin.pve import routes

    result = routes.call(root, "POST", "/nodes/kpro6/qemu/129/status/start", {}, background=True)
    upid = str(result.data)
    time.sleep(1.0)
    assert tasks.task_status(root, upid)["status"] == "running"  # blocked in the unbind
    assert driver(root, "0000:41:00.0") == "nvidia"
    assert "with non-zero usage count!" in (root / hwsim.DMESG).read_text()
    threading.Timer(0.2, ct_state.unlink).start()  # the container stops: /dev/nvidia0 closed
    assert tasks.wait(root, upid, timeout=10)["exitstatus"] == "OK"
    assert driver(root, "0000:41:00.0") == "vfio-pci"
