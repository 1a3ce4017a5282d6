"""The VMs' PCI mappings and owned hostpci entries, planned from kpro6's facts (gpuhost/plan/guests/vms.py)."""

from __future__ import annotations

import pytest

from gpuhost.observe.proxmox import parse_pci_mappings
from gpuhost.plan.guests.vms import PciMapping, mapping_id, raw_slots
from gpuhost.plan.make import make_plan
from gpuhost.plan.model import PlanError
from tests.unit.hosts import kpro6
from tests.unit.test_plan import KPRO6, host, lxc, vm

VM129 = vm(129, ["0000:c1:00.0", "0000:e1:00.0"], machine="q35")


def configs(*files: tuple[str, str]) -> tuple[int, list[str]]:
    lines: list[str] = []
    for path, text in files:
        lines += [f"==> {path} <==", *text.splitlines()]
    return (0, lines)


def test_hand_made_raw_entries_of_the_same_vm_are_taken_over_through_root() -> None:
    # kpro6's VM 129 passes its two boards with raw entries (the operator's hand config)
    plan = make_plan("kpro6", host(KPRO6, VM129, lxc(200, "rest")), kpro6())
    split = plan.vm_split
    assert sorted(split.mappings) == ["gpuhost-0000-c1-00", "gpuhost-0000-e1-00"]
    c1 = split.mappings["gpuhost-0000-c1-00"]
    # the whole board (no function), with the ids and group Proxmox checks at every start
    assert c1 == PciMapping("gpuhost-0000-c1-00", "0000:c1:00", "10de:2bb1", "10de:0000", 16)
    assert c1.map_entry("kpro6") == (
        "id=10de:2bb1,iommugroup=16,node=kpro6,path=0000:c1:00,subsystem-id=10de:0000"
    )
    vm129 = split.vms[129]
    assert vm129.adopt == {"hostpci0": "0000:c1:00,pcie=1", "hostpci1": "0000:e1:00,pcie=1"}
    assert vm129.hostpci == {
        "hostpci0": "mapping=gpuhost-0000-c1-00,pcie=1",
        "hostpci1": "mapping=gpuhost-0000-e1-00,pcie=1",
    }
    assert vm129.machine == "q35" and vm129.delete == ()  # pc-q35-8.1 now: the spec says q35


def test_converged_vm_needs_nothing_and_stale_owned_entries_go() -> None:
    conf = (
        "machine: q35\nname: vm129\nhostpci0: mapping=gpuhost-0000-c1-00,pcie=1\n"
        "hostpci3: mapping=gpuhost-0000-e1-00,pcie=1\nhostpci5: mapping=gpuhost-0000-41-00,pcie=1\n"
        "hostpci6: 0000:03:00.0\n"  # the user's own NIC: left alone
    )
    facts = kpro6(PveGuestConfigs=configs(("/etc/pve/qemu-server/129.conf", conf)))
    vm129 = make_plan("kpro6", host(KPRO6, VM129, lxc(200, "rest")), facts).vm_split.vms[129]
    assert vm129.hostpci == {} and vm129.adopt == {} and vm129.machine is None
    assert vm129.delete == ("hostpci5",)  # 41:00 is no longer this VM's
    assert vm129.changes


def test_new_entries_take_the_lowest_free_slots() -> None:
    conf = "machine: q35\nname: vm129\nhostpci0: 0000:03:00.0\nhostpci2: 0000:04:00.0\n"
    facts = kpro6(PveGuestConfigs=configs(("/etc/pve/qemu-server/129.conf", conf)))
    vm129 = make_plan("kpro6", host(KPRO6, VM129, lxc(200, "rest")), facts).vm_split.vms[129]
    assert vm129.hostpci == {
        "hostpci1": "mapping=gpuhost-0000-c1-00,pcie=1",
        "hostpci3": "mapping=gpuhost-0000-e1-00,pcie=1",
    }


def test_a_raw_entry_passing_another_guests_gpu_refuses_the_plan() -> None:
    conf = "machine: q35\nname: vm130\nhostpci0: host=0000:41:00.0;0000:41:00.1,pcie=1\n"
    facts = kpro6(PveGuestConfigs=configs(("/etc/pve/qemu-server/130.conf", conf)))
    with pytest.raises(PlanError) as refused:
        make_plan("kpro6", host(KPRO6, lxc(200, "rest")), facts)
    (problem,) = refused.value.problems
    assert problem.startswith(
        "vm 130 has hostpci0: host=0000:41:00.0;0000:41:00.1,pcie=1, an entry gpuhost does not "
        "own, passing GPU 0000:41:00 that the spec gives to lxc 200 (ct200); remove it"
    )


def test_a_vm_without_config_gets_no_mappings() -> None:
    facts = kpro6(PveGuestConfigs=(0, []))
    split = make_plan("kpro6", host(KPRO6, VM129, lxc(200, "rest")), facts).vm_split
    assert split.mappings == {} and not split.vms[129].exists


def test_raw_slots_and_ids() -> None:
    assert raw_slots("0000:c1:00,pcie=1") == ["0000:c1:00"]
    assert raw_slots("host=c1:00.0;0000:e1:00.1,x-vga=1") == ["0000:c1:00", "0000:e1:00"]
    assert raw_slots("mapping=gpu0,pcie=1") == []
    assert mapping_id("0000:c1:00.0") == "gpuhost-0000-c1-00"


def test_pci_mapping_section_config() -> None:
    text = (
        "gpuhost-0000-c1-00\n\tmap id=10de:2bb1,iommugroup=16,node=kpro6,path=0000:c1:00\n"
        "\tmap id=10de:2bb1,node=kpro7,path=0000:41:00\n\tdescription gpuhost\n\n"
        "nic0\n\tmap id=8086:1533,node=kpro6,path=0000:03:00.0\n"
    )
    mappings = parse_pci_mappings(text)
    assert mappings["gpuhost-0000-c1-00"].maps == (
        "id=10de:2bb1,iommugroup=16,node=kpro6,path=0000:c1:00",
        "id=10de:2bb1,node=kpro7,path=0000:41:00",
    )
    assert mappings["nic0"].description is None


def test_a_stale_owned_entry_is_overwritten_in_place_not_deleted_and_set() -> None:
    # Proxmox refuses to set and delete one key in one call (400)
    conf = "machine: q35\nname: vm129\nhostpci0: mapping=gpuhost-0000-c1-00,pcie=1\nhostpci1: mapping=gpuhost-0000-41-00,pcie=1\n"
    facts = kpro6(PveGuestConfigs=configs(("/etc/pve/qemu-server/129.conf", conf)))
    vm129 = make_plan("kpro6", host(KPRO6, VM129, lxc(200, "rest")), facts).vm_split.vms[129]
    assert vm129.hostpci == {"hostpci1": "mapping=gpuhost-0000-e1-00,pcie=1"}
    assert vm129.delete == ()
