import pytest

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.proxmox import parse_boot_tool_status, parse_kernel_list, parse_pve_configs
from tests.unit.conftest import FIXTURES, proxmox


def test_boot_tool_systemd_boot() -> None:
    status = parse_boot_tool_status(proxmox("boot-tool-status-uefi.out"))
    assert status.configured and status.booted_with == "uefi"
    assert status.loader == "systemd-boot"
    assert status.esps[0] == ("4A1C-9E2B", "uefi", ["6.14.8-2-bpo12-pve", "6.8.12-9-pve"])


def test_boot_tool_grub_on_esp() -> None:
    status = parse_boot_tool_status(proxmox("boot-tool-status-grub-esp.out"))
    assert (status.configured, status.booted_with, status.loader) == (True, "legacy bios", "grub")


def test_boot_tool_unconfigured_is_plain_grub() -> None:
    status = parse_boot_tool_status(proxmox("boot-tool-status-unconfigured.out"))
    assert (status.configured, status.loader, status.esps) == (False, "grub", [])


def test_boot_tool_unknown_line_fails_loudly() -> None:
    with pytest.raises(UnparsedOutput, match="frobnicated"):
        parse_boot_tool_status(["ESP frobnicated", "#gpuhost-exit=0"])
    with pytest.raises(UnparsedOutput, match="missing exit status"):
        parse_boot_tool_status(["System currently booted with uefi"])


def test_kernel_list_with_pins() -> None:
    kernels = parse_kernel_list(proxmox("kernel-list.out"))
    assert kernels.manual == []
    assert kernels.automatic == ["6.14.11-5-pve", "6.17.13-1-pve"]
    assert (kernels.pinned, kernels.next_boot) == ("6.8.12-9-pve", "6.8.12-17-pve")


def test_kernel_list_without_pins() -> None:
    kernels = parse_kernel_list(proxmox("kernel-list-nopin.out"))
    assert kernels.all == ["6.14.8-2-bpo12-pve", "6.8.12-9-pve"]
    assert kernels.pinned is None and kernels.next_boot is None
    with pytest.raises(UnparsedOutput):
        parse_kernel_list(["Automatically selected kernels:", "not a kernel!"])


def test_guest_configs() -> None:
    configs = parse_pve_configs(proxmox("guest-configs.out"))
    assert set(configs) == {("lxc", 200), ("qemu", 129), ("qemu", 130)}
    ct = configs[("lxc", 200)]
    assert ct.current.description == ["inference container%3A GPUs 0-5"]
    assert ct.current.options["dev0"] == "/dev/nvidia0,gid=44"
    assert ct.current.options["dev10"] == "/dev/nvidia-uvm-tools"
    assert ct.current.raw == [
        ("lxc.cgroup2.devices.allow", "c 195:* rwm"),
        ("lxc.cgroup2.devices.allow", "c 509:* rwm"),  # written with ' = ' in the file
        ("lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"),
    ]
    assert ct.pending is not None and ct.pending.options == {"dev3": "/dev/nvidia1"}
    assert set(ct.snapshots) == {"before-driver-upgrade"}
    assert "dev0" not in ct.snapshots["before-driver-upgrade"].options
    vm = configs[("qemu", 129)]
    assert vm.current.options["machine"] == "pc-q35-8.1"
    assert vm.current.options["hostpci1"] == "0000:e1:00,pcie=1"
    cloud = configs[("qemu", 130)]
    assert cloud.pending is not None and cloud.pending.options == {"memory": "32768"}
    assert cloud.snapshots["special:cloudinit"].options == {"ipconfig0": "ip=dhcp"}
    assert cloud.current.options["memory"] == "16384"


def test_guest_configs_reject_garbage() -> None:
    with pytest.raises(UnparsedOutput, match="NotAKey"):
        parse_pve_configs(["==> /etc/pve/qemu-server/100.conf <==", "NotAKey value"])
    with pytest.raises(UnparsedOutput, match="before any file"):
        parse_pve_configs(["arch: amd64"])
    # raw lxc.* keys belong to containers only
    with pytest.raises(UnparsedOutput):
        parse_pve_configs(["==> /etc/pve/qemu-server/100.conf <==", "lxc.mount.entry: x"])


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("pve-container-commit-101.conf", "lxc"),
        ("pve-container-delete-203.conf", "lxc"),
        ("qemu-server-q35-linux-hostpci.conf", "qemu"),
        ("lxc-gpu-200.conf", "lxc"),
    ],
)
def test_guest_configs_from_proxmox_test_suites(name: str, kind: str) -> None:
    """Configs copied verbatim from pve-container's and qemu-server's own test files."""
    lines = (FIXTURES / "proxmox" / "configs" / name).read_text().splitlines()
    config = parse_pve_configs(
        [f"==> /etc/pve/{'lxc' if kind == 'lxc' else 'qemu-server'}/100.conf <==", *lines]
    )
    guest = config[(kind, 100)]
    assert guest.current.options  # every line was understood (unknown ones raise)
    if name.startswith("qemu-server"):
        assert guest.current.options["machine"] == "q35"
        assert guest.current.options["hostpci4"] == "d0:17.0,pcie=1,rombar=0"
    if name == "pve-container-commit-101.conf":
        assert guest.snapshots["test"].description == ["test comment"]
