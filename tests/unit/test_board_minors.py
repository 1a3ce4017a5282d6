"""After boards moved between nvidia and vfio-pci, the Plan gives containers the nodes their GPUs
will have once the run is done (the driver's first-free minors), and a board in a running
guest's config is named before it is moved by hand."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from gpuhost.plan.guests.boardholders import holders
from gpuhost.plan.guests.devices import planned_minors
from gpuhost.plan.model import GpuAssignment, Owner
from tests.unit.test_ctplan import facts

CT = Owner("lxc", 200, "ct200")
VM = Owner("vm", 129, "vm129")
BOARDS = ("01", "21", "41", "61", "c1")


def gpu(bus: str, now: str | None, planned: str) -> GpuAssignment:
    owner = CT if planned == "nvidia" else VM
    return GpuAssignment(0, f"0000:{bus}:00.0", "RTX", 0, None, now, planned, owner)


def info(**minors: int) -> SimpleNamespace:
    return SimpleNamespace(
        gpu_information={f"0000:{b}:00.0": {"Device Minor": str(m)} for b, m in minors.items()}
    )


def test_a_reboot_numbers_the_host_gpus_in_pci_order() -> None:
    gpus = [gpu("01", "nvidia", "nvidia"), gpu("21", "vfio-pci", "vfio-pci")]
    gpus += [gpu("41", "vfio-pci", "nvidia"), gpu("61", "nvidia", "nvidia")]
    minors = planned_minors(gpus, info(**{"01": 0, "61": 3}), rebooting=True)
    assert minors == {"0000:01:00.0": 0, "0000:41:00.0": 1, "0000:61:00.0": 2}


def test_live_moves_keep_minors_and_a_returning_gpu_takes_the_freed_one() -> None:
    # 41 went to vfio-pci by hand (freeing 2), then the VM's c1 came to nvidia and took 2.
    gpus = [gpu("01", "nvidia", "nvidia"), gpu("21", "nvidia", "nvidia")]
    gpus += [gpu("41", "vfio-pci", "nvidia"), gpu("61", "nvidia", "nvidia")]
    gpus += [gpu("c1", "nvidia", "vfio-pci")]
    minors = planned_minors(gpus, info(**{"01": 0, "21": 1, "61": 3, "c1": 2}), rebooting=False)
    # c1 leaves first (deploys/vfio.py), so 41 gets minor 2 back; the others keep theirs
    assert minors == {"0000:01:00.0": 0, "0000:21:00.0": 1, "0000:41:00.0": 2, "0000:61:00.0": 3}
    # two GPUs come back: the lowest free minors, in PCI order
    gpus = [gpu("01", "vfio-pci", "nvidia"), gpu("21", "nvidia", "nvidia")]
    gpus += [gpu("41", "vfio-pci", "nvidia")]
    assert planned_minors(gpus, info(**{"21": 0}), rebooting=False) == {
        "0000:01:00.0": 1,
        "0000:21:00.0": 0,
        "0000:41:00.0": 2,
    }


def test_a_running_guest_with_the_board_is_named() -> None:
    conf = "arch: amd64\nhostname: ct200\nostype: debian\ndev3: /dev/nvidia2,mode=0666\n"
    base = facts(conf=conf, running=True)
    minors = {f"0000:{b}:00.0": {"Device Minor": str(i)} for i, b in enumerate(BOARDS)}
    now = replace(base, gpu_information=minors)
    assert holders(("0000:41:00.0", "0000:41:00.1"), now) == ["CT 200 (/dev/nvidia2 as dev3)"]
    assert holders(("0000:61:00.0",), now) == []  # CT 200 has /dev/nvidia2 only
    stopped = replace(now, guest_statuses={("lxc", 200): "stopped"})
    assert holders(("0000:41:00.0",), stopped) == []
    raw = "lxc.mount.entry: /dev/nvidia3 dev/nvidia3 none bind,optional,create=file\n"
    with_raw = replace(facts(conf=conf + raw, running=True), gpu_information=minors)
    assert holders(("0000:61:00.0",), with_raw) == ["CT 200 (/dev/nvidia3 as lxc.mount.entry)"]


def test_a_running_vm_with_the_board_is_named() -> None:
    base = facts()
    vm = base.guest_configs[("lxc", 200)]
    config = replace(
        vm,
        kind="qemu",
        vmid=129,
        current=replace(
            vm.current, options={"hostpci0": "0000:c1:00,pcie=1", "hostpci1": "mapping=m1"}
        ),
    )
    mappings = "m1\n\tmap id=10de:2bb1,node=kpro6,path=0000:e1:00\n"
    managed = replace(
        base.managed,
        files={**base.managed.files, "/etc/pve/mapping/pci.cfg": mappings},
        links={**base.managed.links, "/etc/pve/local": "nodes/kpro6"},
    )
    now = replace(
        base,
        guest_configs={("qemu", 129): config},
        guest_statuses={("qemu", 129): "running"},
        managed=managed,
    )
    assert holders(("0000:c1:00.0",), now) == ["VM 129 (hostpci0)"]
    assert holders(("0000:e1:00.0",), now) == ["VM 129 (hostpci1)"]
    assert holders(("0000:41:00.0",), now) == []
