"""The first vertical slice: spec -> plan -> boot parameters and module options -> reboot -> facts.

On a fresh kpro6 twin (systemd-boot, AMD) and a GRUB/Intel twin, the deploy changes the boot
configuration, reboots once, and the simulated boot shows the planned command line and
uvm_disable_hmm=Y; a second run changes nothing and does not reboot; --dry changes no file;
a parameter the user added by hand survives.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuhost.inventory import load_inventory
from tests.e2e.conftest import PYINFRA, ROOT, deploy, inventory, manifest, with_driver

# The shipped inventory's spec: the twin of kpro6 gets exactly what the real host would.
KPRO6 = load_inventory(ROOT / "inventory" / "kpro6.py")["kpro6"][0].model_dump(mode="json")
LUMPED = {
    "kernel": {"version": "6.8.12-9-pve"},
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
    if profile == "kpro6":  # systemd-boot: the new command line is tried through its own entry
        assert "Trial boot: the new boot configuration of kernel" in changes
        assert "Kernel parameters: " not in changes  # the commit writes them
    else:  # GRUB: no trial entry (yet): the files, then a plain reboot
        assert "Kernel parameters: " in changes and "Reboot to apply boot-time changes" in changes
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
    if profile == "kpro6":  # booted through the trial entry, then committed
        assert "gpuhost.trial=1" in cmdline and "oops=panic" in cmdline
        loader = host.file("/etc/kernel/cmdline").content_string.split()
        assert all(p in loader for p in planned) and "oops=panic" not in loader
        for name in ("panic_on_oops", "softlockup_panic", "hardlockup_panic", "hung_task_panic"):
            assert host.file(f"/proc/sys/kernel/{name}").content_string.strip() == "0", name
        assert not host.file("/boot/gpuhost-trial").exists
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

    Without the ACS override, the plan made after the IOMMU comes on refuses to give that GPU to
    a VM; with it, the next boot splits the group and the same split is planned."""
    twin = fresh("lumped")
    with_driver(twin, modules, LUMPED["driver"]["version"])
    guests = [
        {"kind": "vm", "vmid": 140, "name": "vm140", "machine": "q35", "gpus": ["0000:19:00.0"]},
        {"kind": "lxc", "ctid": 300, "name": "ct300", "gpus": "rest"},
    ]
    plain = {**LUMPED, "boot": {}, "guests": guests}
    inv = inventory(tmp_path / "plain.py", twin, plain)
    first = deploy(inv)  # the IOMMU is off: groups unknown, so only a note; turns it on
    assert first.rc == 0 and first.reboots == 1, first.output
    assert "IOMMU groups are not visible" in first.output
    gpuhost = [str(PYINFRA.parent / "gpuhost"), "plan"]
    refused = subprocess.run(
        [*gpuhost, str(inv)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2
    assert (
        "IOMMU group 21 of 0000:19:00.0 (vm 140 (vm140)) also holds 0000:1a:00.0" in refused.stderr
    )

    split = inventory(tmp_path / "split.py", twin, {**plain, "boot": LUMPED["boot"]})
    second = deploy(split)
    assert second.rc == 0 and second.reboots == 1, second.output
    # still lumped now, so the check waits for the boot that activates the override
    assert "pcie_acs_override=downstream,multifunction is not active yet" in second.output
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
    # the claim written while the group was lumped took the board only: the NIC stays the host's
    twin.reconnect()
    _, nic, _ = twin.run("readlink /sys/bus/pci/devices/0000:1a:00.0/driver")
    assert nic.strip().endswith("/i40e")
