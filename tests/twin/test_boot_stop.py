"""A trial whose systemd stops in emergency or rescue mode (twin/boot_stop.py): no sshd and no
timers.target, so only gpuhost's backstop in the trial's initramfs brings it back (the real
boot: tests/vm/test_emergency_backstop.py). On the twin's GRUB-on-ESP profile: the trial entry is a
top-level menu entry of gpuhost's (next_entry, a true one-shot there), the default the pinned
kernel's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from twin import boot, pve
from twin import hwtesting as ht
from twin.boot_stop import BACKSTOP_SCRIPT, backstop_deadline, initramfs_prompt, userspace_stop
from twin.hwsim import grubenv
from twin.hwtesting import read, refresh, state
from twin.kernel_choice import ESP_DIR
from twin.profile import Boot, load_profile
from twin.pve import cli
from twin.pve.initramfs import CRYPTROOT_HOOK, initramfs_record

OLD = "6.8.12-9-pve"
ESP = "9B1C-4F2A"
GRUB_TEXT = 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n'


def _trial_root(
    tmp_path: Path, options: str, with_backstop: bool, crypttab: str = ""
) -> tuple[Path, object]:
    prof = load_profile("kpro6").model_copy(
        update={
            "boot": Boot(firmware="uefi", loader="grub", default_grub=GRUB_TEXT, grub_on_esp=True)
        }
    )
    root = ht.make_root(tmp_path, prof)
    pve.install(root, prof)
    cli.run("proxmox-boot-tool", ["kernel", "pin", OLD], root)
    cli.run("proxmox-boot-tool", ["refresh"], root)
    ht.boot_root(root, prof)
    esp = root / ESP_DIR / ESP
    files = {BACKSTOP_SCRIPT: "#!/bin/sh\n"} if with_backstop else {}
    if crypttab:
        files["/etc/crypttab"] = crypttab
    ht.write(root, f"{ESP_DIR}/{ESP}/gpuhost-trial/initrd.img-{OLD}", json.dumps({"files": files}))
    menu = {
        "gpuhost-trial": {
            "title": f"gpuhost trial of Linux {OLD}",
            "linux": f"/vmlinuz-{OLD}",
            "options": options,
            "initrd": f"/gpuhost-trial/initrd.img-{OLD}",
        }
    }
    refresh(root, menu=menu)
    grubenv.write(esp / "grub/grubenv", {"next_entry": "gpuhost-trial"})
    return root, prof


@pytest.mark.parametrize("stop", ["systemd.unit=emergency.target", "emergency", "single"])
def test_a_trial_stopped_before_its_gate_comes_back_through_the_backstop(
    tmp_path: Path, stop: str
) -> None:
    options = (
        f"root=ZFS=rpool/ROOT/pve-1 boot=zfs {stop} gpuhost.trial=1 gpuhost.trial_deadline=1500"
    )
    root, prof = _trial_root(tmp_path, options, with_backstop=True)
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD
    assert "gpuhost.trial=1" not in state(root)["cmdline"]  # the default entry, not the trial's
    mode = userspace_stop(options)
    assert state(root)["boot_attempts"][0] == {
        "kernel": OLD,
        "result": f"stopped in {mode}; rebooted by the backstop (1500 s)",
    }
    log = ht.run(root, "journalctl", "-b", "-1", "-k").stdout
    assert "gpuhost: trial boot not confirmed within 1500s of its start" in log


def test_without_the_backstop_in_its_initramfs_the_trial_waits_for_the_console(
    tmp_path: Path,
) -> None:
    """The deadline timer alone cannot help: timers.target is never reached."""
    options = "root=ZFS=rpool/ROOT/pve-1 boot=zfs systemd.unit=rescue.target gpuhost.trial=1 gpuhost.trial_deadline=1500"
    root, prof = _trial_root(tmp_path, options, with_backstop=False)
    with pytest.raises(boot.BrickedError, match="rescue mode and waits for someone at the console"):
        ht.boot_root(root, prof)
    assert read(root, "var/lib/gpuhost-twin/hw.json")


def test_what_stops_and_what_arms() -> None:
    assert userspace_stop("root=x ro quiet") == ""
    assert userspace_stop("systemd.unit=rescue.target systemd.unit=multi-user.target") == ""
    assert userspace_stop("systemd.unit=multi-user.target -b") == "emergency mode"
    armed = {"files": {BACKSTOP_SCRIPT: ""}}
    assert backstop_deadline("gpuhost.trial_deadline=90", armed) == 90
    assert backstop_deadline("gpuhost.trial_deadline=9x", armed) is None
    assert backstop_deadline("gpuhost.trial_deadline=90", {"files": {}}) is None
    assert backstop_deadline("gpuhost.trial=1", armed) is None


@pytest.mark.parametrize("reboots", [True, False])
def test_a_grub_trial_entry_whose_files_are_gone(tmp_path: Path, reboots: bool) -> None:
    """Real GRUB 2.06 runs the entry and its initrd fails (tests/vm/test_grub_entry_fails_to_load):
    gpuhost's entry then reboots into the default; an entry without that waits for a key."""
    root, prof = _trial_root(tmp_path, "root=ZFS=rpool/ROOT/pve-1 boot=zfs", with_backstop=False)
    (root / ESP_DIR / ESP / f"gpuhost-trial/initrd.img-{OLD}").unlink()
    cfg = json.loads(read(root, boot.BOOTCFG))
    cfg["menu"]["gpuhost-trial"]["on_failure"] = "reboot" if reboots else ""
    ht.write(root, boot.BOOTCFG, json.dumps(cfg))
    if not reboots:
        with pytest.raises(boot.BrickedError, match="waits for a key"):
            ht.boot_root(root, prof)
        return
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD and "gpuhost.trial" not in state(root)["cmdline"]


TRIAL = "root=ZFS=rpool/ROOT/pve-1 boot=zfs gpuhost.trial=1 gpuhost.trial_deadline=1500"


@pytest.mark.parametrize(
    ("stop", "result"),
    [
        # initramfs-tools' panic() reboots instead of the shell when panic=N > 0 is given (the
        # real boot: tests/vm/test_emergency_backstop.py)
        ("break=premount panic=10", "stopped in the initramfs shell (premount); rebooted by panic=10"),
        ("break panic=10", "stopped in the initramfs shell (premount); rebooted by panic=10"),
        ("break=mount,top panic=-1", "stopped in the initramfs shell (top); rebooted by panic=-1"),
        # no panic=: the shell waits, but the backstop was armed at init-top
        ("break=premount", "stopped in the initramfs shell (premount); rebooted by the backstop (1500 s)"),
    ],
)  # fmt: skip
def test_a_trial_stopped_in_the_initramfs_shell_comes_back(
    tmp_path: Path, stop: str, result: str
) -> None:
    root, prof = _trial_root(tmp_path, f"{TRIAL} {stop}", with_backstop=True)
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD and "gpuhost.trial=1" not in state(root)["cmdline"]
    assert state(root)["boot_attempts"][0] == {"kernel": OLD, "result": result}


@pytest.mark.parametrize(
    ("stop", "why"),
    [
        ("break=top", "stops in the initramfs shell (top) and waits for someone at the console"),
        ("break=premount panic=0", "halts in the initramfs (panic=0)"),
    ],
)
def test_an_initramfs_stop_nothing_reboots_bricks_the_host(
    tmp_path: Path, stop: str, why: str
) -> None:
    """break=top stops before the init-top scripts, the backstop among them; panic=0 halts."""
    root, prof = _trial_root(tmp_path, f"{TRIAL} {stop}", with_backstop=True)
    with pytest.raises(boot.BrickedError, match=re.escape(why)):
        ht.boot_root(root, prof)


# An encrypted volume the initramfs unlocks, added since the old initramfs was made (the real
# boot: tests/vm/test_trial_passphrase.py)
CRYPTTAB = "data /dev/disk/by-id/virtio-d none luks,initramfs,noauto\n"


@pytest.mark.parametrize(
    ("stop", "result"),
    [
        ("", "stopped at the initramfs' passphrase prompt for data; rebooted by the backstop (1500 s)"),
        # panic= does not help: askpass waits, nothing calls panic()
        ("panic=10", "stopped at the initramfs' passphrase prompt for data; rebooted by the backstop (1500 s)"),
        # a break before local-top stops first; one after it is never reached
        ("break=premount panic=10", "stopped in the initramfs shell (premount); rebooted by panic=10"),
        ("break=bottom", "stopped at the initramfs' passphrase prompt for data; rebooted by the backstop (1500 s)"),
    ],
)  # fmt: skip
def test_a_trial_stopped_at_a_passphrase_prompt_comes_back_through_the_backstop(
    tmp_path: Path, stop: str, result: str
) -> None:
    root, prof = _trial_root(tmp_path, f"{TRIAL} {stop}", with_backstop=True, crypttab=CRYPTTAB)
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD and "gpuhost.trial=1" not in state(root)["cmdline"]
    assert state(root)["boot_attempts"][0] == {"kernel": OLD, "result": result}
    if not stop:
        log = ht.run(root, "journalctl", "-b", "-1", "-k").stdout
        assert "gpuhost: trial boot not confirmed within 1500s of its start" in log


def test_a_passphrase_prompt_without_the_backstop_bricks_the_host(tmp_path: Path) -> None:
    root, prof = _trial_root(tmp_path, TRIAL, with_backstop=False, crypttab=CRYPTTAB)
    with pytest.raises(boot.BrickedError, match="passphrase prompt for data and waits"):
        ht.boot_root(root, prof)


def test_the_initramfs_carries_crypttab_only_with_cryptsetup_initramfs(tmp_path: Path) -> None:
    """Its hook copies the entries (hooks/cryptroot); without the package nothing asks."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/crypttab").write_text(CRYPTTAB)
    assert "/etc/crypttab" not in initramfs_record(tmp_path, OLD)["files"]
    hook = tmp_path / CRYPTROOT_HOOK
    hook.parent.mkdir(parents=True)
    hook.write_text("#!/bin/sh\n")
    record = initramfs_record(tmp_path, OLD)
    assert record["files"]["/etc/crypttab"] == CRYPTTAB and initramfs_prompt(record) == "data"
    assert initramfs_prompt({"files": {"/etc/crypttab": "# data x none luks,initramfs\n"}}) == ""
