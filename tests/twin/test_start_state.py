"""A twin whose profile has a ``start`` section comes up as the captured host (twin/startstate.py):
its files over the factory boot config, the kernel it ran with the command line it ran, the
Proxmox package versions, the driver and modules as loaded, the first-boot majors, its guests
(those that ran, running); and a reboot does none of it again."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from gpuhost.observe.hostfacts import parse_raw
from gpuhost.observe.live import gather
from twin import startstate
from twin.fromcapture_start import guest_texts
from twin.pve import routes
from twin.pytest_plugin import TwinHandle

PROFILES = Path(__file__).parents[2] / "gpuhost-twin/twin/profiles"
OLD, NEW = "6.8.12-9-pve", "6.14.8-2-bpo12-pve"
FILE_CMDLINE = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet iommu=pt\n"
# what booted: the loader's entry from before the file's last edit (no refresh since)
RAN = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet"
HOOK = "#!/bin/sh\nexit 0\n"
CT101 = "arch: amd64\nhostname: web\nmemory: 2048\nostype: debian\nrootfs: local-zfs:subvol-101-disk-0,size=8G\n"
CT102 = "arch: amd64\nhostname: idle\nostype: debian\nrootfs: local-zfs:subvol-102-disk-0,size=8G\n"
VM201 = "cores: 4\nmachine: q35\nmemory: 8192\nname: vm\nostype: l26\nscsi0: local-zfs:vm-201-disk-0,size=32G\n"
PACKAGES = {"pve-manager": "8.3.5", "pve-container": "5.2.4", "qemu-server": "8.3.12"}


def captured(tmp: Path, name: str, **start: object) -> str:
    """The h200x2 profile with a newer kernel installed beside the one that ran, and a start."""
    data = yaml.safe_load((PROFILES / "h200x2.yaml").read_text())
    data["name"] = name
    data["kernels"].append({"version": NEW, "gcc": "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"})
    data["start"] = start
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def hosts(twin_fleet, tmp_path_factory) -> dict[str, TwinHandle]:
    tmp = tmp_path_factory.mktemp("start")
    pve = captured(
        tmp,
        "captured-pve",
        files={
            "/etc/kernel/cmdline": FILE_CMDLINE,
            "/etc/modprobe.d/user.conf": "# the user's own\noptions nvidia NVreg_EnableGpuFirmware=1\n",
            "/var/lib/vz/snippets/hook.sh": HOOK,
            "/etc/pve/nodes/h200x2/config": "description: the node's notes\n",
        },
        links={"/etc/pve/local": "nodes/h200x2", "/etc/gpuhost/cmdline": "/etc/kernel/cmdline"},
        running_kernel=OLD,
        cmdline=f"initrd=\\EFI\\proxmox\\{OLD}\\initrd.img-{OLD} {RAN}",
        driver={"version": "580.159.04", "open": True, "loaded": ["nvidia_uvm", "nvidia"]},
        guests=[
            {"kind": "lxc", "vmid": 101, "config": CT101, "running": True},
            {"kind": "lxc", "vmid": 102, "config": CT102},
            {"kind": "qemu", "vmid": 201, "config": VM201, "running": True},
        ],
        packages=PACKAGES,
    )
    bare = captured(
        tmp,
        "captured-bare",
        packages={},
        os_release={"ID": "ubuntu"},
        driver={"version": "580.159.04", "open": False},  # the proprietary module, not captured
    )
    t0 = time.monotonic()
    handles = dict(zip(("pve", "bare"), twin_fleet.start_profiles([pve, bare]), strict=True))
    print(f"start-state twins up in {time.monotonic() - t0:.1f} s")
    yield handles
    for handle in handles.values():
        twin_fleet.stop(handle)


def out(twin: TwinHandle, command: str) -> str:
    rc, stdout, stderr = twin.run(command)
    assert rc == 0, (command, stderr)
    return stdout


def test_files_win_over_the_factory_config(hosts: dict[str, TwinHandle]) -> None:
    twin = hosts["pve"]
    assert out(twin, "cat /etc/kernel/cmdline") == FILE_CMDLINE
    assert out(twin, "readlink /etc/gpuhost/cmdline") == "/etc/kernel/cmdline\n"
    assert out(twin, "stat -c %a /var/lib/vz/snippets/hook.sh") == "755\n"
    # pmxcfs's links stay the twin's; the captured node's files are the twin's node's
    assert out(twin, "readlink /etc/pve/local") == f"nodes/{twin.name}\n"
    assert out(twin, "cat /etc/pve/local/config") == "description: the node's notes\n"


def test_the_kernel_that_ran_boots_with_its_command_line(hosts: dict[str, TwinHandle]) -> None:
    twin = hosts["pve"]
    assert out(twin, "uname -r") == f"{OLD}\n"  # not the newer one the loader defaults to
    assert out(twin, "cat /proc/cmdline").split()[1:] == RAN.split()


def test_proxmox_versions_as_captured(hosts: dict[str, TwinHandle]) -> None:
    twin = hosts["pve"]
    assert out(twin, "dpkg-query -W -f '${Version}' pve-manager") == PACKAGES["pve-manager"]
    assert out(twin, "dpkg-query -W -f '${Version}' qemu-server") == PACKAGES["qemu-server"]
    assert out(twin, "pveversion").startswith(f"pve-manager/{PACKAGES['pve-manager']}/")
    assert out(twin, "pveversion").endswith(f"(running kernel: {OLD})\n")
    version = routes.call(twin.root, "GET", "/version", {}).data
    assert version["version"] == "8.3.5" and version["release"] == "8.3"  # type: ignore[index]


def test_driver_and_modules_as_loaded(hosts: dict[str, TwinHandle]) -> None:
    twin = hosts["pve"]
    modules = {line.split()[0] for line in out(twin, "cat /proc/modules").splitlines()}
    assert {"nvidia", "nvidia_uvm"} <= modules
    assert "Open Kernel Module for x86_64  580.159.04" in out(
        twin, "cat /proc/driver/nvidia/version"
    )
    devices = out(twin, "cat /proc/devices")
    assert "238 nvidia-uvm\n" in devices and "241 nvidia-caps\n" in devices  # first_boot_majors
    assert out(twin, "ls /dev/nvidia-uvm")


def test_guests_as_captured(hosts: dict[str, TwinHandle]) -> None:
    twin = hosts["pve"]
    assert startstate.report(twin.root) == [
        "nvidia-modprobe -u -c=0: exit status 0",
        "lxc 101: started",
        "qemu 201: started",
    ]
    assert out(twin, "pct config 101").splitlines()[1] == "hostname: web"
    listing = out(twin, "pct list")
    assert " running " in listing.splitlines()[1] and " stopped " in listing.splitlines()[2]
    assert " running " in out(twin, "qm list").splitlines()[1]
    assert out(twin, "pct exec 101 -- cat /etc/hostname")


def test_gpuhost_reads_the_guests_back(hosts: dict[str, TwinHandle]) -> None:
    """What gpuhost's own read (PveGuestConfigs, GuestStatuses) gets: the configs as they were
    given, and which ran."""
    twin = hosts["pve"]
    data = {"ssh_hostname": twin.address, "ssh_user": "root", "ssh_key": str(twin.key),
            "ssh_known_hosts_file": str(twin.known_hosts), "ssh_strict_host_key_checking": "yes"}  # fmt: skip
    raw = gather([(twin.name, data)])[twin.name]
    facts = parse_raw(raw)
    assert sorted(facts.guest_configs) == [("lxc", 101), ("lxc", 102), ("qemu", 201)]
    assert facts.guest_statuses == {
        ("lxc", 101): "running",
        ("lxc", 102): "stopped",
        ("qemu", 201): "running",
    }
    texts = guest_texts(raw["PveGuestConfigs"][1])
    assert texts == {("lxc", 101): CT101, ("lxc", 102): CT102, ("qemu", 201): VM201}


def test_without_proxmox_packages(hosts: dict[str, TwinHandle]) -> None:
    twin = hosts["bare"]
    rc, stdout, _ = twin.run("dpkg-query -W -f '${Status}' pve-manager qemu-server pve-container")
    assert rc != 0 and "installed" not in stdout
    assert twin.run("command -v pveversion")[0] != 0
    assert 'ID="ubuntu"' in out(twin, "cat /etc/os-release")
    assert out(twin, "uname -r") == f"{NEW}\n"  # no running_kernel: the newest, as the loader
    version = out(twin, "cat /proc/driver/nvidia/version")
    assert "NVIDIA UNIX x86_64 Kernel Module  580.159.04" in version  # MODULE_LICENSE("NVIDIA")
    assert startstate.report(twin.root) == []  # loaded not captured: only what the boot loads


def test_a_reboot_does_not_redo_it(hosts: dict[str, TwinHandle]) -> None:
    twin = hosts["pve"]
    before = json.loads((twin.root / startstate.START_STATE).read_text())
    twin.reboot()
    assert out(twin, "uname -r") == f"{NEW}\n"  # the loader's default, like any host's
    assert json.loads((twin.root / startstate.START_STATE).read_text()) == before
    listing = out(twin, "pct list").splitlines()
    assert all(" stopped " in line for line in listing[1:])  # 101 has no onboot
