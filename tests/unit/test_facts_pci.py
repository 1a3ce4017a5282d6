import pytest

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.pci import (
    IommuDomains,
    IommuState,
    parse_iommu_groups,
    parse_iommu_state,
    parse_pci_devices,
)
from tests.unit.conftest import captured
from tests.unit.hosts import pci_lines


def test_h200x2_pci_devices() -> None:
    devices = parse_pci_devices(captured("h200x2", "PciDevices"))
    gpus = [d for d in devices.values() if d.is_gpu]
    assert [g.bdf for g in gpus] == ["0000:00:06.0", "0000:00:07.0"]
    gpu = devices["0000:00:06.0"]
    assert gpu.vendor_device == "10de:2335"
    assert gpu.class_code == "030200"
    assert gpu.driver == "nvidia"
    assert gpu.driver_override is None  # sysfs "(null)"
    assert gpu.numa_node is None  # sysfs -1
    assert gpu.iommu_group is None  # no IOMMU exposed in that VM
    assert gpu.parent is None  # directly under the host bridge pci0000:00
    assert devices["0000:00:00.0"].driver is None
    assert devices["0000:00:01.0"].driver == "virtio-pci"


def test_a_driver_name_with_spaces() -> None:
    """A q35 VM with QEMU's i6300esb watchdog, the vm tier's GPU boards and amd-iommu: the
    watchdog's driver is "i6300ESB timer" (a deploy failed on that line before)."""
    devices = parse_pci_devices(captured("vm-q35", "PciDevices"))
    assert devices["0000:00:03.0"].driver == "i6300ESB timer"
    assert devices["0000:00:03.0"].vendor_device == "8086:25ab"
    assert devices["0000:01:00.1"].driver == "xhci_hcd"  # a board's USB-C function
    assert devices["0000:01:00.0"].driver is None  # the GPU stand-in: no host driver
    groups = parse_iommu_groups(captured("vm-q35", "IommuGroups"))
    assert devices["0000:01:00.0"].iommu_group == devices["0000:01:00.1"].iommu_group
    assert sorted(groups[devices["0000:04:01.0"].iommu_group]) == [
        "0000:03:00.0",
        "0000:04:01.0",
        "0000:04:02.0",
    ]


def test_h200x1_has_one_gpu() -> None:
    devices = parse_pci_devices(captured("h200x1", "PciDevices"))
    assert [d.bdf for d in devices.values() if d.is_gpu] == ["0000:00:06.0"]


def test_parent_bridge_and_groups_from_sysfs_paths() -> None:
    lines = pci_lines(
        "0000:41:00.0",
        "pci0000:40/0000:40:01.1/0000:41:00.0",
        "10de",
        "2bb1",
        "030000",
        0,
        "vfio-pci",
        42,
    )
    lines = [line.replace("driver_override:(null)", "driver_override:vfio-pci") for line in lines]
    dev = parse_pci_devices(lines)["0000:41:00.0"]
    assert (dev.parent, dev.iommu_group, dev.numa_node) == ("0000:40:01.1", 42, 0)
    assert (dev.driver, dev.driver_override, dev.is_gpu) == ("vfio-pci", "vfio-pci", True)


def test_device_without_driver_or_group() -> None:
    lines = [
        line
        for line in pci_lines(
            "0000:00:00.0", "pci0000:00/0000:00:00.0", "8086", "0d57", "060000", -1, "x", 1
        )
        if not line.startswith("link")
    ]
    dev = parse_pci_devices(lines)["0000:00:00.0"]
    assert (dev.driver, dev.iommu_group, dev.numa_node, dev.parent) == (None, None, None, None)


def test_unknown_pci_line_fails_loudly() -> None:
    with pytest.raises(UnparsedOutput, match="bdf=zz"):
        parse_pci_devices(["bdf=zz path=/x"])
    with pytest.raises(UnparsedOutput, match="device without its ids"):
        parse_pci_devices(["dev 0000:00:01.0 ../../../devices/pci0000:00/0000:00:01.0"])


def test_iommu_groups() -> None:
    assert parse_iommu_groups(captured("h200x2", "IommuGroups")) == {}  # IOMMU not exposed
    groups = parse_iommu_groups(["14 0000:00:1f.3 0000:41:00.0 0000:41:00.1", "3 0000:00:01.0"])
    assert groups == {14: ["0000:00:1f.3", "0000:41:00.0", "0000:41:00.1"], 3: ["0000:00:01.0"]}
    with pytest.raises(UnparsedOutput):
        parse_iommu_groups(["x 0000:00:01.0"])


def test_iommu_state_on_the_real_machine() -> None:
    # h200x1 (2026-12-01): dmesg says "Default domain type: Translated", but the microVM
    # exposes no IOMMU unit and no group to the guest: the state is empty
    state = IommuDomains().process(captured("h200x1", "IommuDomains"))
    assert state == IommuState() and not state.active


def test_iommu_state_host() -> None:
    lines = [
        "/sys/kernel/iommu_groups/0/type:DMA-FQ",
        "/sys/kernel/iommu_groups/12/type:identity",
        "/sys/kernel/iommu_groups/13/type:unmanaged",  # a group vfio owns for a running VM
        "iommu ivhd1",
        "iommu ivhd0",
    ]
    state = parse_iommu_state(lines)
    assert state.active and state.translated and state.units == ("ivhd0", "ivhd1")
    assert state.group_types == {0: "DMA-FQ", 12: "identity", 13: "unmanaged"}
    assert not parse_iommu_state(["/sys/kernel/iommu_groups/3/type:identity"]).translated


def test_iommu_state_rejects_garbage() -> None:
    with pytest.raises(UnparsedOutput, match="unknown domain type"):
        parse_iommu_state(["/sys/kernel/iommu_groups/0/type:Translated"])
    with pytest.raises(UnparsedOutput):
        parse_iommu_state(["dmar0"])
