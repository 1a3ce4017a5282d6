"""The first vertical slice: spec -> plan -> boot parameters and module options -> reboot -> facts.

On a fresh kpro6 twin (systemd-boot, AMD) and a GRUB/Intel twin, the deploy tries the new boot
configuration through a trial entry of its own, commits it, and the simulated boot shows the
planned command line and uvm_disable_hmm=Y; a second run changes nothing and does not reboot;
--dry changes no file; a parameter the user added by hand survives.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuhost.spec.inventory import load_inventory
from tests.e2e.conftest import PYINFRA, ROOT, deploy, inventory, manifest, with_driver

# The shipped inventory's spec: the twin of kpro6 gets exactly what the real host would.
KPRO6 = load_inventory(ROOT / "inventory" / "kpro6.py")["kpro6"][0].model_dump(mode="json")
LUMPED = {
    # plain GRUB with /boot on LVM: no true one-shot, accepted explicitly as for a kernel trial
    "kernel": {"version": "6.8.12-9-pve", "trial": {"without_oneshot": True}},
    "driver": {"version": "580.95.05"},
    "boot": {"acs_override": "downstream,multifunction"},
    "guests": [{"kind": "lxc", "ctid": 300, "name": "ct300", "gpus": "rest"}],
}
CASES = {
    # profile: (spec, file the user edits by hand, sed that adds a parameter, the parameters)
    "kpro6": (
        KPRO6,
        "/etc/kernel/cmdline",
        r"s/$/ mitigations=off/",
        ["iommu=pt", "pci=realloc"],
    ),
    "lumped": (
        LUMPED,
        "/etc/default/grub",
        r's/^GRUB_CMDLINE_LINUX_DEFAULT="quiet/GRUB_CMDLINE_LINUX_DEFAULT="quiet mitigations=off/',
        ["intel_iommu=on", "pcie_acs_override=downstream,multifunction"],
    ),
}


@pytest.mark.parametrize("profile", list(CASES))
def test_boot_parameters_and_module_options_converge(
    profile: str, fresh, modules, tmp_path: Path
) -> None:
    spec, user_file, user_edit, planned = CASES[profile]
    twin = fresh(profile)
    version = spec["driver"]["version"]
    with_driver(twin, modules, version)
    host = twin.host
    assert host.file("/proc/driver/nvidia/version").contains(version)
    uvm = host.file("/sys/module/nvidia_uvm/parameters/uvm_disable_hmm")
    assert not uvm.exists or uvm.content_string.strip() == "N"  # nothing loads nvidia_uvm yet
    rc, _, err = twin.run(f"sed -i '{user_edit}' {user_file}")  # the operator's own parameter
    assert rc == 0, err
    inv = inventory(tmp_path / "inv.py", twin, spec)

    # --dry shows the plan and the changes, and changes nothing
    before = manifest(twin.root)
    boot_id = twin.boot_id()
    dry = deploy(inv, "--dry")
    assert dry.rc == 0, dry.output
    assert "GPU plan for" in dry.output and "this run reboots the host, because:" in dry.output
    changes = dry.output.split("--> Detected changes:", 1)[1]
    # the new command line is tried through an entry of its own (systemd-boot's
    # gpuhost-trial.conf, GRUB's gpuhost-trial menu entry); the commit writes the loader files
    assert "Trial boot: the new boot configuration of kernel" in changes
    assert "Kernel parameters: " not in changes
    assert manifest(twin.root) == before
    assert twin.boot_id() == boot_id

    # the real run: changes the boot configuration and reboots exactly once
    first = deploy(inv)
    assert first.rc == 0, first.output
    assert first.reboots == 1, first.output
    assert twin.boot_id() != boot_id
    twin.reconnect()  # the reboot dropped the test's own SSH session too
    host = twin.host
    cmdline = host.file("/proc/cmdline").content_string.split()
    assert all(p in cmdline for p in planned), cmdline
    assert "mitigations=off" in cmdline  # the user's parameter survived
    # booted through the trial entry, then committed
    assert "gpuhost.trial=1" in cmdline and "oops=panic" in cmdline
    loader = host.file(user_file if profile == "kpro6" else "/etc/default/grub.d/zz-gpuhost.cfg")
    assert all(p in loader.content_string for p in planned)
    assert "oops=panic" not in loader.content_string
    for name in ("panic_on_oops", "softlockup_panic", "hardlockup_panic", "hung_task_panic"):
        assert host.file(f"/proc/sys/kernel/{name}").content_string.strip() == "0", name
    assert not host.file("/boot/gpuhost-trial").exists
    if profile == "lumped":  # GRUB on LVM could not clear next_entry: the commit did
        assert host.run("grub-editenv /boot/grub/grubenv list").stdout.strip() in (
            "",
            "next_entry=",
        )
        assert "gpuhost-trial" not in host.file("/boot/grub/grub.cfg").content_string
    assert "amd_iommu=on" not in cmdline  # not a kernel option: the AMD IOMMU is on by default
    assert (
        host.file("/sys/module/nvidia_uvm/parameters/uvm_disable_hmm").content_string.strip() == "Y"
    )
    assert host.file("/etc/modprobe.d/gpuhost-nvidia.conf").contains(
        "options nvidia_uvm uvm_disable_hmm=1"
    )
    assert host.file("/etc/modprobe.d/gpuhost-blacklist.conf").contains("^blacklist nouveau")

    # converged: a second run changes nothing and does not reboot
    boot_id = twin.boot_id()
    second = deploy(inv)
    assert second.rc == 0, second.output
    assert second.reboots == 0 and not second.changed, second.output
    assert twin.boot_id() == boot_id
    assert "no reboot needed" in second.output


def test_refused_plan_changes_nothing(fresh, tmp_path: Path) -> None:
    twin = fresh("kpro6")
    spec = {
        **KPRO6,
        "guests": [
            {"kind": "vm", "vmid": 129, "name": "vm129", "machine": "q35", "gpus": ["0000:42:00.0"]}
        ],
    }
    before = manifest(twin.root)
    run = deploy(inventory(tmp_path / "inv.py", twin, spec))
    assert run.rc != 0
    assert "the plan is refused" in run.output and "0000:42:00.0 is not an NVIDIA GPU" in run.output
    assert manifest(twin.root) == before


def test_plan_command_reads_the_live_host(fresh, tmp_path: Path) -> None:
    """`gpuhost plan` without --facts: one SSH round trip to the twin, the table, nothing changed."""
    twin = fresh("lumped")
    before = manifest(twin.root)
    run = subprocess.run(
        [
            str(PYINFRA.parent / "gpuhost"),
            "plan",
            str(inventory(tmp_path / "inv.py", twin, LUMPED)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert f"GPU plan for {twin.name}" in run.stdout
    assert "boot loader: grub" in run.stdout
    assert "+intel_iommu=on +iommu=pt +pcie_acs_override=downstream,multifunction" in run.stdout
    assert manifest(twin.root) == before


def test_acs_override_splits_a_lumped_group_for_a_vm(fresh, modules, tmp_path: Path) -> None:
    """The lumped board: GPU 0000:19:00.0 shares an IOMMU group with a switch and a NIC.

    Without the ACS override, the trial boot that turns the IOMMU on shows the group, the plan
    made on it refuses to give that GPU to a VM, so the gate fails and the host goes back to
    the configuration it had; with the override, the trial boot splits the group and the same
    split is planned and committed."""
    twin = fresh("lumped")
    with_driver(twin, modules, LUMPED["driver"]["version"])
    guests = [
        {"kind": "vm", "vmid": 140, "name": "vm140", "machine": "q35", "gpus": ["0000:19:00.0"]},
        {"kind": "lxc", "ctid": 300, "name": "ct300", "gpus": "rest"},
    ]
    plain = {**LUMPED, "boot": {}, "guests": guests}
    inv = inventory(tmp_path / "plain.py", twin, plain)
    first = deploy(inv)  # the IOMMU is off: groups unknown, so only a note; a trial turns it on
    assert first.rc != 0 and "IOMMU groups are not visible" in first.output, first.output[-3000:]
    assert "failed the trial checks" in first.output
    assert "IOMMU group 21 of 0000:19:00.0 (vm 140 (vm140)) also holds 0000:1a:00.0" in first.output
    twin.reconnect()
    assert "intel_iommu=on" not in (twin.root / "proc/cmdline").read_text()  # back as it was
    assert twin.run("rm /var/lib/gpuhost/trial")[0] == 0  # as the failure message says
    gpuhost = [str(PYINFRA.parent / "gpuhost"), "plan"]

    split = inventory(tmp_path / "split.py", twin, {**plain, "boot": LUMPED["boot"]})
    second = deploy(split)
    assert second.rc == 0 and second.reboots == 1, second.output[-3000:]
    planned = subprocess.run(
        [*gpuhost, str(split)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert planned.returncode == 0, planned.stderr
    row = next(line for line in planned.stdout.splitlines() if line.startswith("0    0000:19:00.0"))
    assert row.split()[-7:] == [
        "24",
        "vfio-pci",  # claimed at boot by gpuhost-vfio.conf (its board only, not the lumped NIC)
        "->",
        "vfio-pci",
        "vm",
        "140",
        "(vm140)",
    ]  # own group
    # the claim written before the group was split took the board only: the NIC stays the host's
    twin.reconnect()
    _, nic, _ = twin.run("readlink /sys/bus/pci/devices/0000:1a:00.0/driver")
    assert nic.strip().endswith("/i40e")
