"""A kernel that lacks what the host needs from Proxmox's packaging is refused before it is
installed (deploys/kernel.py, gpuhost/build/features.py), on kpro6 twins whose root is on ZFS as
the Proxmox installer leaves a UEFI ZFS install (root=ZFS=rpool/ROOT/pve-1, examples/kpro6-facts):
a stored `make bindeb-pkg`-style package without zfs.ko, and one installed by hand."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from gpuhost.audit.gate import run_gate
from gpuhost.build.artifacts import ArtifactKey, ArtifactStore
from gpuhost.spec.inventory import load_inventory
from tests.e2e.conftest import deploy, inventory, manifest
from tests.e2e.guests import ct_config, put
from tests.e2e.reprovision import GCC, OLD, fresh_kpro6
from tests.e2e.test_boot_slice import KPRO6
from tests.e2e.test_trial_deploy import (
    TREE,
    VERSION,
    boot_attempts,
    pinned,
    plant_firmware,
    unpack_kernel,
)
from tests.e2e.test_vm_mappings import token_env
from tests.kerneldebs import kernel_deb, proxmox_debs
from twin import hardware, userspace
from twin.profile import Kernel
from twin.pytest_plugin import PVE_DIRS

PLAIN = "6.14.8-2-bpo12-pve"


def store_with(tmp_path, zfs: bool, acs: bool) -> ArtifactStore:
    store = ArtifactStore(tmp_path / "store")
    deb = kernel_deb(tmp_path, PLAIN, zfs=zfs, acs=acs)
    store.put(ArtifactKey("kernel", PLAIN, PLAIN, GCC, "cfg1"), [deb])
    return store


def build_spec(store: ArtifactStore, **boot) -> dict:
    return {
        "kernel": {
            "version": PLAIN,
            "source": "build",
            "keep": [OLD],
            "build": {"repo": "/srv/linux", "base_config": "tinyconfig"},
        },
        "toolchain": {"gcc": "12.2.0"},
        "driver": {"version": "595.71.05"},
        "artifacts": {"store": str(store.root)},
        "boot": boot,
    }


def test_a_stored_kernel_without_zfs_ko_is_refused_before_install_on_a_zfs_root(fresh, tmp_path):
    twin = fresh(fresh_kpro6(tmp_path))
    assert twin.run("findmnt -n -o FSTYPE -T /")[1].strip() == "zfs"
    inv = inventory(tmp_path / "inv.py", twin, build_spec(store_with(tmp_path, False, True)))
    before = manifest(twin.root)
    run = deploy(inv)
    assert run.rc != 0
    assert f"kernel {PLAIN} has no zfs.ko (linux-image-{PLAIN}" in run.output, run.output[-4000:]
    assert "its root file system is on ZFS" in run.output
    assert manifest(twin.root) == before  # not pinned, not uploaded, not installed
    assert not (twin.root / f"boot/vmlinuz-{PLAIN}").exists()
    assert twin.run("uname -r")[1].strip() == OLD


def test_without_the_acs_patch_acs_override_is_refused(fresh, tmp_path):
    twin = fresh(fresh_kpro6(tmp_path))
    store = store_with(tmp_path, True, False)
    spec = build_spec(store, acs_override="downstream,multifunction")
    run = deploy(inventory(tmp_path / "inv.py", twin, spec))
    assert run.rc != 0
    assert "lacks Proxmox's pcie_acs_override patch" in run.output, run.output[-4000:]
    assert "has no zfs.ko" not in run.output


def test_a_kernel_installed_by_hand_without_zfs_ko_is_not_trial_booted(fresh, tmp_path):
    twin = fresh(fresh_kpro6(tmp_path))
    hardware.add_kernel(twin.root, Kernel(version=PLAIN, gcc=GCC, zfs=False))
    assert twin.run(f"update-initramfs -c -k {PLAIN}")[0] == 0
    spec = {
        "kernel": {"version": PLAIN, "keep": [OLD]},
        "toolchain": {"gcc": "12.2.0"},
        "driver": {"version": "595.71.05"},
    }
    before = manifest(twin.root)
    run = deploy(inventory(tmp_path / "inv.py", twin, spec))
    assert run.rc != 0
    assert f"kernel {PLAIN} has no zfs.ko (its files on the host)" in run.output, run.output[-4000:]
    assert manifest(twin.root) == before
    # Proxmox's own build of it (zfs.ko in its modules) goes ahead: its trial is planned.
    unpack_kernel(twin, PLAIN)
    dry = deploy(inventory(tmp_path / "inv.py", twin, spec), "--dry")
    assert dry.rc == 0 and "trial boot of" in dry.output, dry.output[-4000:]


def storage_profile(tmp_path, **boot) -> str:
    """kpro6 on a btrfs root (a Proxmox UEFI install with systemd-boot) whose guests live on a
    ZFS data pool `tank`, a zfspool storage `vmdata`, and a degraded pool `scratch`."""
    data = yaml.safe_load(Path(fresh_kpro6(tmp_path)).read_text())
    data["boot"].update(root_fs="btrfs", kernel_cmdline="root=/dev/sda3 ro quiet", **boot)
    data["zfs_pools"] = [
        {"name": "tank", "state": "ONLINE"},
        {"name": "scratch", "state": "DEGRADED"},
    ]
    path = tmp_path / "kpro6-tank.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def gate(twin, tmp_path):
    inv = inventory(
        tmp_path / "inv.py", twin, {"kernel": {"version": OLD}, "driver": {"version": "595.71.05"}}
    )
    name, (spec, _) = next(iter(load_inventory(inv).items()))
    result = run_gate(name, spec, twin.run)
    return {line.split(":")[0]: line for line in result.failed}, result


def test_the_gate_fails_on_unhealthy_pools_and_inactive_storages(fresh, tmp_path):
    twin = fresh(storage_profile(tmp_path))
    cfg = twin.root / "etc/pve/storage.cfg"
    cfg.write_text(cfg.read_text() + "\nzfspool: vmdata\n\tpool tank/vm\n\tcontent images\n")
    failed, result = gate(twin, tmp_path)
    assert "storage.pve" in result.passed, failed
    assert "zpool scratch" in failed["storage.zfs"] and "DEGRADED" in failed["storage.zfs"]
    assert "tank" not in failed["storage.zfs"]
    # A kernel without zfs.ko (one installed behind gpuhost's back) boots the btrfs root, but
    # imports no pool: the storage the guests live on is gone.
    hardware.add_kernel(twin.root, Kernel(version=PLAIN, gcc=GCC, zfs=False))
    assert twin.run(f"update-initramfs -c -k {PLAIN}")[0] == 0
    assert twin.run(f"proxmox-boot-tool kernel pin {PLAIN} && proxmox-boot-tool refresh")[0] == 0
    twin.reboot()
    assert twin.run("uname -r")[1].strip() == PLAIN
    failed, result = gate(twin, tmp_path)
    assert "The ZFS modules are not loaded." in failed["storage.zfs"]
    assert "storage vmdata (zfspool)" in failed["storage.pve"]
    assert "cannot open 'tank': no such pool" in failed["storage.pve"]


def test_a_proxmox_packaged_kernel_and_a_new_command_line_pass_one_trial(fresh, tmp_path):
    """Issue 21's "done when" on a kpro6 twin whose root is on ZFS: the custom kernel, packaged
    as Proxmox packages it (proxmox-kernel/-headers, zfs.ko, the ACS patch), and kpro6's new
    command line go through one trial boot, are committed, and the guests then run with the
    kernel's panic settings off; the next run changes nothing."""
    twin = fresh(fresh_kpro6(tmp_path))
    assert twin.run("findmnt -n -o FSTYPE -T /")[1].strip() == "zfs"
    store = ArtifactStore(tmp_path / "store")
    store.put(
        ArtifactKey("kernel", PLAIN, PLAIN, GCC, "cfg1"), proxmox_debs(tmp_path, PLAIN, twin.root)
    )
    userspace.install_root(twin.root, VERSION)
    plant_firmware(twin.root, VERSION)
    twin.run(PVE_DIRS)
    put(twin, "/etc/pve/lxc/200.conf", ct_config("ct200", []))
    put(twin, "/etc/pve/qemu-server/129.conf", "machine: q35\nname: vm129\n")
    assert twin.run("pct start 200 && qm start 129")[0] == 0  # the guests run before the deploy
    spec = copy.deepcopy(KPRO6)
    spec["kernel"]["build"]["repo"] = "/srv/pve-kernel"
    spec["artifacts"] = {"store": str(store.root)}
    spec["driver"]["source"] = {"tree": str(TREE), "store": str(tmp_path / "driver-store")}
    for guest in spec["guests"]:
        guest.pop("cuda", None)
    inv = inventory(tmp_path / "inv.py", twin, spec)
    first = deploy(inv, env=token_env(twin))
    assert first.rc == 0, first.output[-5000:]
    assert f"kernel {PLAIN} passed its trial boot" in first.output
    assert [a["kernel"] for a in boot_attempts(twin)] == [PLAIN]  # one trial boot, committed
    assert twin.run("uname -r")[1].strip() == PLAIN and pinned(twin) == PLAIN
    booted = (twin.root / "proc/cmdline").read_text().split()  # the trial boot, kept running
    assert {"pci=realloc", "iommu=pt", "gpuhost.trial=1", "oops=panic"} <= set(booted)
    cmdline = (twin.root / "etc/kernel/cmdline").read_text()  # what every later boot gets
    assert "pci=realloc" in cmdline and "panic=" not in cmdline
    for name in ("panic_on_oops", "softlockup_panic", "hardlockup_panic"):
        assert (twin.root / f"proc/sys/kernel/{name}").read_text().strip() == "0", name
    _, out, _ = twin.run("pct status 200; qm status 129")
    assert out.split() == ["status:", "running", "status:", "running"], out
    second = deploy(inv, env=token_env(twin))
    assert second.rc == 0 and not second.changed, second.output[-3000:]
