"""The main deploy's kernel trial boot on twins of each boot path: a new kernel is installed
beside the running one (which is pinned first), booted once through the loader's true one-shot,
gated by the audit's host checks and only then pinned; a second run changes nothing.

The twins start as a freshly installed kpro6 (only 6.8.12-9-pve) with the new kernel's package
already unpacked (its image, config, headers and initramfs: what dpkg and the package's hooks
leave), the NVIDIA userspace and GSP firmware of the driver; the deploy builds the NVIDIA modules
for the new kernel on the twin (real Kbuild against its headers) and runs the trial. The kernel
from the artifact store, installed by the deploy itself, is tests/e2e/test_reprovision.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ROOT, deploy, inventory, manifest
from tests.e2e.guests import audit
from tests.e2e.reprovision import GCC, OLD, fresh_kpro6
from twin import hardware, userspace
from twin.modbuild import GSP_FIRMWARE
from twin.profile import Kernel
from twin.pytest_plugin import TwinHandle

TREE = ROOT / "tests/fixtures/driver-src/open-gpu-kernel-modules"
NEW = "6.14.8-2-bpo12-pve"
NEWER = "6.17.2-1-pve"  # an apt upgrade behind gpuhost's back
VERSION = "595.71.05"
LUMPED = yaml.safe_load((ROOT / "gpuhost-twin/twin/profiles/lumped.yaml").read_text())
GRUB = LUMPED["boot"]["default_grub"]
PATHS = {
    "systemd-boot": {},
    "grub-esp": {"firmware": "uefi", "loader": "grub", "grub_on_esp": True, "default_grub": GRUB},
    "grub-lvm": {"firmware": "bios", "loader": "grub", "boot_on_lvm": True, "default_grub": GRUB},
}


def unpack_kernel(twin: TwinHandle, release: str, gcc: str = GCC) -> None:
    """What installing a kernel package leaves: image, config, modules dir, headers, and the
    initramfs its postinst hook makes (proxmox-boot-tool's hook syncs the ESPs on its own)."""
    hardware.add_kernel(twin.root, Kernel(version=release, gcc=gcc))
    rc, _, err = twin.run(f"update-initramfs -c -k {release}")
    assert rc == 0, err


def plant_firmware(root: Path, release: str) -> None:
    fw = root / f"lib/firmware/nvidia/{VERSION}"
    fw.mkdir(parents=True, exist_ok=True)
    for blob in GSP_FIRMWARE:
        (fw / blob).write_bytes(b"twin GSP firmware " + release.encode() + b"\n")


def trial_twin(fresh, tmp: Path, path: str, firmware: str = VERSION, **spec_kernel):
    twin = fresh(fresh_kpro6(tmp, PATHS[path]))
    unpack_kernel(twin, NEW)
    userspace.install_root(twin.root, VERSION)
    plant_firmware(twin.root, firmware)
    spec = {
        "kernel": {"version": NEW, "keep": [OLD], **spec_kernel},
        "toolchain": {"gcc": "12.2.0"},
        "driver": {
            "version": VERSION,
            "source": {"tree": str(TREE), "store": str(tmp / "store")},
        },
    }
    return twin, inventory(tmp / "inv.py", twin, spec)


def pinned(twin: TwinHandle) -> str:
    rc, out, err = twin.run("proxmox-boot-tool kernel list")
    assert rc == 0, err
    lines = out.splitlines()
    return lines[lines.index("Pinned kernel:") + 1].strip() if "Pinned kernel:" in lines else ""


def boot_attempts(twin: TwinHandle) -> list[dict]:
    return json.loads((twin.root / "var/lib/gpuhost-twin/hw.json").read_text())["boot_attempts"]


@pytest.mark.parametrize("path", ["systemd-boot", "grub-esp"])
def test_new_kernel_is_trial_booted_gated_and_pinned(fresh, tmp_path, path):
    twin, inv = trial_twin(fresh, tmp_path, path)
    first = deploy(inv)
    assert first.rc == 0, first.output[-4000:]
    assert f"kernel {NEW} passed its trial boot" in first.output
    assert twin.run("uname -r")[1].strip() == NEW
    assert pinned(twin) == NEW
    assert [a["kernel"] for a in boot_attempts(twin)] == [NEW]  # one boot, straight in
    assert not (twin.root / "var/lib/gpuhost/trial").exists()
    cmdline = (twin.root / "proc/cmdline").read_text().split()
    assert "panic=10" in cmdline  # the trial boot carried them ...
    for loader_file in ("etc/kernel/cmdline", "etc/default/grub.d/zz-gpuhost.cfg"):
        if (twin.root / loader_file).exists():  # ... the committed loader files do not
            assert "panic=10" not in (twin.root / loader_file).read_text()
    assert audit(twin, inv) == {}
    second = deploy(inv)
    assert second.rc == 0 and not second.changed, second.output[-3000:]
    assert second.reboots == 0 and "rebooting into" not in second.output


def test_a_newer_kernel_installed_behind_gpuhosts_back_does_not_boot(fresh, tmp_path):
    twin, inv = trial_twin(fresh, tmp_path, "systemd-boot")
    assert deploy(inv).rc == 0
    unpack_kernel(twin, NEWER)  # apt upgrade: its hook refreshes the ESPs
    assert twin.run("proxmox-boot-tool refresh")[0] == 0
    twin.reboot()
    assert twin.run("uname -r")[1].strip() == NEW
    again = deploy(inv)
    assert again.rc == 0 and not again.changed, again.output[-3000:]


def test_plain_grub_on_lvm_is_refused_with_the_ways_out(fresh, tmp_path):
    twin, inv = trial_twin(fresh, tmp_path, "grub-lvm")
    before = manifest(twin.root)
    run = deploy(inv)
    assert run.rc != 0
    assert "no true one-shot on this host" in run.output, run.output[-5000:]
    assert "proxmox-boot-tool init" in run.output and "without_oneshot" in run.output
    assert manifest(twin.root) == before
    assert twin.run("uname -r")[1].strip() == OLD


@pytest.mark.parametrize("path", ["systemd-boot", "grub-esp"])
def test_a_panicking_trial_kernel_comes_back_and_the_run_fails(fresh, tmp_path, path):
    twin, inv = trial_twin(fresh, tmp_path, path, firmware="580.95.05")
    first = deploy(inv)
    assert first.rc != 0
    assert f"the host is back on {OLD}" in first.output
    assert "GSP firmware mismatch" in first.output  # the trial boot's own kernel log
    assert "Traceback" not in first.output
    assert [a["result"].split(";")[0] for a in boot_attempts(twin)] == ["panicked", "booted"]
    assert twin.run("uname -r")[1].strip() == OLD and pinned(twin) == OLD
    # the old kernel runs its guests without the trial's panic settings, and no entry keeps them
    assert (twin.root / "proc/sys/kernel/panic_on_oops").read_text().strip() == "0"
    for loader_file in ("etc/kernel/cmdline", "etc/default/grub.d/zz-gpuhost.cfg"):
        if (twin.root / loader_file).exists():
            assert "oops=panic" not in (twin.root / loader_file).read_text(), loader_file
    # not retried: the record stops the next run before anything changes
    before = manifest(twin.root)
    again = deploy(inv)
    assert again.rc != 0 and "did not come up" in again.output
    assert manifest(twin.root) == before
    # fixed (the driver's own firmware), record removed as the message says: it converges
    plant_firmware(twin.root, VERSION)
    assert twin.run("rm /var/lib/gpuhost/trial")[0] == 0
    fixed = deploy(inv)
    assert fixed.rc == 0, fixed.output[-4000:]
    assert twin.run("uname -r")[1].strip() == NEW and pinned(twin) == NEW
    assert not deploy(inv).changed


def test_a_kernel_built_by_another_gcc_is_refused_before_anything_changes(fresh, tmp_path):
    twin = fresh(fresh_kpro6(tmp_path, {}))
    unpack_kernel(twin, NEW, gcc="gcc (Debian 13.2.0-25) 13.2.0")
    spec = {
        "kernel": {"version": NEW},
        "toolchain": {"gcc": "12.2.0"},
        "driver": {"version": VERSION},
    }
    inv = inventory(tmp_path / "inv.py", twin, spec)
    before = manifest(twin.root)
    run = deploy(inv)
    assert run.rc != 0
    assert "13.2.0" in run.output and "12.2.0" in run.output
    assert manifest(twin.root) == before


def test_dry_run_changes_nothing(fresh, tmp_path):
    twin, inv = trial_twin(fresh, tmp_path, "systemd-boot")
    before = manifest(twin.root)
    dry = deploy(inv, "--dry")
    assert dry.rc == 0, dry.output[-3000:]
    assert "trial boot of" in dry.output
    assert manifest(twin.root) == before
    assert twin.run("uname -r")[1].strip() == OLD


def test_a_new_command_line_that_fails_its_trial_leaves_the_fallback_as_it_was(fresh, tmp_path):
    """A command-line change on the running kernel is a trial through gpuhost-trial.conf: the
    fallback's entry, /etc/kernel/cmdline and initramfs stay as they were until the gate
    passes. Here the trial boot panics (its oops=panic meets an nvidia oops: GSP firmware of
    another release), the loader's default boots the old configuration, and the run says so."""
    twin, inv = trial_twin(fresh, tmp_path, "systemd-boot")
    assert deploy(inv).rc == 0
    spec = {
        "kernel": {"version": NEW, "keep": [OLD]},
        "toolchain": {"gcc": "12.2.0"},
        "boot": {"extra": ["pcie_aspm=off"]},
        "driver": {
            "version": VERSION,
            "source": {"tree": str(TREE), "store": str(tmp_path / "store")},
        },
    }
    inv = inventory(tmp_path / "inv.py", twin, spec)
    plant_firmware(twin.root, "580.95.05")  # the oops that only the trial turns into a panic
    kept = {
        f: (twin.root / f).read_bytes() for f in ("etc/kernel/cmdline", f"boot/initrd.img-{NEW}")
    }
    esp = (twin.root / "etc/kernel/proxmox-boot-uuids").read_text().split()[0]
    entry = f"var/lib/gpuhost-twin/esp/{esp}/loader/entries"
    kept[f"{entry}/proxmox-{NEW}.conf"] = (twin.root / entry / f"proxmox-{NEW}.conf").read_bytes()
    run = deploy(inv)
    assert run.rc != 0 and "did not come up" in run.output, run.output[-4000:]
    attempts = [a["result"].split(";")[0] for a in boot_attempts(twin)]
    assert attempts == ["panicked", "booted"]
    cmdline = (twin.root / "proc/cmdline").read_text().split()
    assert "pcie_aspm=off" not in cmdline and "oops=panic" not in cmdline  # the old entry
    assert all((twin.root / f).read_bytes() == data for f, data in kept.items())
    assert not (twin.root / entry / "gpuhost-trial.conf").exists()  # abandoned
    assert (twin.root / "proc/sys/kernel/panic_on_oops").read_text().strip() == "0"
    again = deploy(inv)  # not retried in a loop: the record stops it before any change
    assert again.rc != 0 and "new command line or initramfs" in again.output
