"""gpuhost's GRUB trial entry script (/etc/grub.d/45_gpuhost-trial) as update-grub runs it, checked
by GRUB's own parser (grub-script-check); on real GRUB 2.06: tests/vm/test_grub_entry_fails_to_load.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuhost.plan.trial.grub import GRUB_TRIAL_ID, grub_trial_script
from gpuhost.plan.trial.params import TRIAL_MARK

NEW = "6.14.8-2-bpo12-pve"
PLANNED_GRUB = "root=/dev/mapper/pve-root ro quiet intel_iommu=on iommu=pt"


def test_the_grub_trial_script_prints_its_entry_only_while_its_files_exist(
    tmp_path: Path,
) -> None:
    """The script as update-grub runs it (sh; paths moved under a directory; grub-mkconfig_lib's
    path helper, grub-mkrelpath, stood in by a shell function as for a /boot on the root fs)."""
    boot = tmp_path / "boot"
    text = grub_trial_script(NEW, f"{PLANNED_GRUB} panic=10 {TRIAL_MARK}")
    script = tmp_path / "45_gpuhost-trial"
    script.write_text(text.replace("/boot/", f"{boot}/"))
    (tmp_path / "grub-mkconfig_lib").write_text(
        'make_system_path_relative_to_its_root () { echo "$1"; }\n'
    )
    env = {"PATH": "/usr/bin:/bin", "pkgdatadir": str(tmp_path)}

    def run() -> str:
        done = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert run() == ""  # no kernel, no trial initramfs: no entry
    (boot / "gpuhost-trial").mkdir(parents=True)
    (boot / f"vmlinuz-{NEW}").write_text("kernel")
    (boot / f"gpuhost-trial/initrd.img-{NEW}").write_text("initrd")
    lines = run().replace(f"{boot}/", "/boot/").splitlines()
    assert lines[0] == (
        f"menuentry 'gpuhost trial of Linux {NEW}' --class gnu-linux --class gnu --class os "
        f"$menuentry_id_option '{GRUB_TRIAL_ID}' {{"
    )
    # a file GRUB cannot load (gone, or refused by shim) reboots into the default entry
    assert (
        f"\tif linux\t/boot/vmlinuz-{NEW} {PLANNED_GRUB} panic=10 {TRIAL_MARK}; then true; else"
        in lines
    )
    assert f"\tif initrd\t/boot/gpuhost-trial/initrd.img-{NEW}; then true; else" in lines
    assert lines.count("\t\treboot") == 2 and lines[-1] == "}"
    _grub_script_check("\n".join(lines) + "\n", tmp_path)


def _grub_script_check(text: str, tmp_path: Path) -> None:
    """GRUB's own parser (grub-common's grub-script-check) accepts the entry."""
    if shutil.which("grub-script-check") is None:
        pytest.skip("grub-script-check (grub-common) is not installed")
    cfg = tmp_path / "grub.cfg"
    cfg.write_text(text)
    done = subprocess.run(["grub-script-check", str(cfg)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_without_a_true_one_shot_the_grub_trial_entry_does_not_reboot(tmp_path: Path) -> None:
    """Where GRUB cannot clear next_entry (grub-no-oneshot), a reboot from the entry would
    start it again, forever: the entry stops at GRUB's prompt as before."""
    text = grub_trial_script(NEW, f"{PLANNED_GRUB} {TRIAL_MARK}", back_on_failure=False)
    entry = text.split("cat <<EOF\n", 1)[1].rsplit("EOF\n", 1)[0]
    assert "reboot" not in entry and f"\tlinux\t$linux {PLANNED_GRUB} {TRIAL_MARK}\n" in entry
    _grub_script_check(entry.replace("\\$", "$"), tmp_path)
