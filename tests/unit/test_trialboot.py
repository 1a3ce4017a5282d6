"""Trial boot planning for each boot path (docs/reference/trial-boot.md), on the BootPath and
proxmox-boot-tool outputs of tests/fixtures/proxmox/facts."""

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from gpuhost.observe.boot import parse_boot_path
from gpuhost.observe.proxmox import parse_boot_tool_status
from gpuhost.plan.trial.backstop import BACKSTOP_SCRIPT, drop_backstop
from gpuhost.plan.trial.boot import plan_trial_boot
from gpuhost.plan.trial.entry import TRIAL_ENTRY
from gpuhost.plan.trial.esp import ESP_MOUNTS, grub_entry, on_esp, systemd_boot_entry
from gpuhost.plan.trial.grub import (
    GRUB_TRIAL_ID,
)
from gpuhost.plan.trial.params import (
    TRIAL_DEADLINE,
    TRIAL_MARK,
    panic_sysctls,
)
from tests.unit.conftest import proxmox
from tests.unit.trialboots import (
    NEW,
    OLD,
    PLANNED,
    UNCONFIGURED,
    ZFS_DEVID,
    G,
    every_command,
    grub_esp,
    grub_lvm,
    grub_plain,
    systemd_boot,
)


def test_exact_one_shot_ids() -> None:
    assert systemd_boot_entry(NEW) == "proxmox-6.14.8-2-bpo12-pve.conf"
    assert grub_entry(NEW, ZFS_DEVID) == (
        "gnulinux-advanced-5f3a1c2e9b7d4e80>gnulinux-6.14.8-2-bpo12-pve-advanced-5f3a1c2e9b7d4e80"
    )


def test_systemd_boot_one_shot_and_read_back() -> None:
    trial = systemd_boot()
    assert (trial.method, trial.can_apply, trial.entry) == ("systemd-boot", True, TRIAL_ENTRY)
    # the pin comes before anything is installed; a stale next-boot pin goes first
    assert trial.pin_running[:3] == (
        "rm -f /etc/kernel/next-boot-pin",
        f"proxmox-boot-tool kernel pin {OLD}",
        "proxmox-boot-tool refresh",
    )
    assert len(trial.pin_running) == 3 + 2  # loader.conf's default checked on both ESPs
    assert trial.prepare[1:3] == (
        f"proxmox-boot-tool kernel add {NEW}",
        "proxmox-boot-tool refresh",
    )
    for uuid, check in zip(("4A1C-9E2B", "4A1D-03F7"), trial.prepare[3:5], strict=True):
        assert f"/dev/disk/by-uuid/{uuid}" in check and f"{ESP_MOUNTS}/{uuid}" in check
        assert f'"$M/loader/entries/proxmox-{NEW}.conf"' in check
        assert f"proxmox-{OLD}.conf" in check  # the default is still the old kernel
    # the trial's own initramfs, beside the one update-initramfs keeps, then its entry per ESP
    assert BACKSTOP_SCRIPT in trial.prepare[6]  # in the trial's initramfs (test below)
    assert trial.prepare[7] == f"mkinitramfs -o /boot/gpuhost-trial/initrd.img-{NEW} {NEW}"
    assert sum(TRIAL_ENTRY in c for c in trial.prepare[8:]) == 2
    oneshot = trial.oneshot
    clear = oneshot.index('bootctl set-default ""')
    assert oneshot.index(f"bootctl set-oneshot {TRIAL_ENTRY}") > clear
    assert oneshot[-1] == (
        f"test \"$(cat /sys/firmware/efi/efivars/LoaderEntryOneShot-{G} | tail -c +5 | tr -d '\\000')\""
        f" = {TRIAL_ENTRY}"
    )
    assert f"test ! -e /sys/firmware/efi/efivars/LoaderEntryDefault-{G}" in oneshot
    assert trial.confirm[0] == f'test "$(uname -r)" = {NEW}'
    assert any("LoaderEntrySelected" in c and TRIAL_ENTRY in c for c in trial.confirm)
    assert f"test ! -e /sys/firmware/efi/efivars/LoaderEntryOneShot-{G}" in trial.confirm
    assert trial.confirm[-1] == f"grep -qw {TRIAL_MARK} /proc/cmdline"
    # commit: the target kernel's initramfs only, pin the new kernel, keep the old one synced
    assert trial.commit[:2] == (drop_backstop(), f"update-initramfs -u -k {NEW}")
    assert not any("-k all" in c for c in trial.commit)
    pin = trial.commit.index(f"proxmox-boot-tool kernel pin {NEW}")
    assert trial.commit[pin + 1 : pin + 4] == (
        f"proxmox-boot-tool kernel add {OLD}",
        f"proxmox-boot-tool kernel remove {NEW}",
        "proxmox-boot-tool refresh",
    )
    # the kernel's own entry is the default after it; the trial entry goes from every ESP
    assert sum(f"proxmox-{NEW}.conf" in c for c in trial.commit) == 2
    assert trial.commit[-2:] == ("rm -rf /boot/gpuhost-trial", drop_backstop())
    assert sum(TRIAL_ENTRY in c and "rm -rf" in c for c in trial.abandon) == 2


def test_only_the_trial_entry_carries_the_panic_parameters() -> None:
    trial = systemd_boot()
    assert trial.entry_options == f"{PLANNED} {' '.join(trial.cmdline)}"
    # nothing else the trial runs names them: no entry but its own gets them
    others = (*trial.pin_running, *trial.oneshot, *trial.commit, *trial.abandon)
    assert not any("oops=panic" in c for c in others)


def test_a_new_command_line_on_the_running_kernel_is_a_trial_too() -> None:
    trial = systemd_boot(running=NEW)
    assert trial.can_apply and trial.same_kernel and trial.entry == TRIAL_ENTRY
    assert not any("kernel add" in c or "kernel remove" in c for c in every_command(trial))
    assert trial.commit[:3] == (
        drop_backstop(),
        f"update-initramfs -u -k {NEW}",
        "proxmox-boot-tool refresh",
    )
    # plain GRUB: its own trial entry too, the commit rebuilds the target's initramfs only
    grub = grub_plain(running=NEW)
    assert grub.can_apply and grub.same_kernel and grub.entry == GRUB_TRIAL_ID
    assert grub.commit[:2] == (drop_backstop(), f"update-initramfs -u -k {NEW}")
    # GRUB on the ESPs: the same entry on every ESP; no kernel pin moves, none is added/removed
    esp = grub_esp(running=NEW)
    assert esp.can_apply and esp.entry == GRUB_TRIAL_ID
    assert not any("kernel pin" in c or "kernel add" in c for c in esp.commit)
    assert any("unset next_entry" in c for c in esp.commit)


def test_the_trial_entry_as_written_on_an_esp(tmp_path: Path) -> None:
    """The prepare step's ESP command, run for real on a directory (mount stubbed)."""
    stub = tmp_path / "bin"
    stub.mkdir()
    for tool in ("mount", "umount"):
        (stub / tool).write_text("#!/bin/sh\nexit 0\n")
        (stub / tool).chmod(0o755)
    boot = tmp_path / "boot"
    (boot / "gpuhost-trial").mkdir(parents=True)
    (boot / f"vmlinuz-{NEW}").write_text("kernel")
    (boot / f"gpuhost-trial/initrd.img-{NEW}").write_text("initrd")
    esp = tmp_path / "esp"
    trial = systemd_boot()
    put = next(c for c in trial.prepare if "4A1C-9E2B" in c and TRIAL_ENTRY in c)
    put = put.replace(ESP_MOUNTS, str(esp)).replace("/boot/", f"{boot}/")
    (esp / "4A1C-9E2B" / "loader/entries").mkdir(parents=True)
    script = put.replace('rmdir "$M"', "true")  # keep the directory to look at
    done = subprocess.run(["sh", "-c", script], env={"PATH": f"{stub}:/usr/bin:/bin"})
    assert done.returncode == 0
    top = esp / "4A1C-9E2B"
    entry = (top / f"loader/entries/{TRIAL_ENTRY}").read_text().splitlines()
    assert entry[2] == f"options  {trial.entry_options}"
    assert entry[3:] == [
        f"linux    /EFI/gpuhost-trial/vmlinuz-{NEW}",
        f"initrd   /EFI/gpuhost-trial/initrd.img-{NEW}",
    ]
    assert (top / f"EFI/gpuhost-trial/initrd.img-{NEW}").read_text() == "initrd"


def test_panic_settings_follow_the_parameters() -> None:
    trial = systemd_boot()
    on = panic_sysctls(list(trial.cmdline))
    assert on == {
        "panic": "10",
        "panic_on_oops": "1",
        "softlockup_panic": "1",
        "hardlockup_panic": "1",
        "hung_task_panic": "1",
    }
    assert set(panic_sysctls(["quiet"]).values()) == {"0"}
    assert panic_sysctls(["oops=panic"])["panic_on_oops"] == "1"  # boot.extra keeps one
    assert panic_sysctls(["panic=1", "panic=-1"])["panic"] == "-1"  # the last one wins


def test_read_back_catches_firmware_that_drops_the_write(tmp_path: Path) -> None:
    # the read-back pipeline itself, on efivarfs-shaped files
    check = systemd_boot().oneshot[-1].replace("/sys/firmware/efi/efivars", str(tmp_path))
    var = tmp_path / f"LoaderEntryOneShot-{G}"
    var.write_bytes(b"\x07\x00\x00\x00" + f"{TRIAL_ENTRY}\0".encode("utf-16-le"))
    assert subprocess.run(["sh", "-c", check]).returncode == 0
    var.write_bytes(b"\x07\x00\x00\x00" + f"proxmox-{OLD}.conf\0".encode("utf-16-le"))
    assert subprocess.run(["sh", "-c", check]).returncode != 0
    var.unlink()  # the firmware refused the write
    assert subprocess.run(["sh", "-c", check], capture_output=True).returncode != 0


def test_esp_helper_unmounts_and_reports_the_body(tmp_path: Path) -> None:
    # with mount stubbed, the helper runs the body in $M and keeps its exit status
    stub = tmp_path / "bin"
    stub.mkdir()
    for tool in ("mount", "umount"):
        (stub / tool).write_text("#!/bin/sh\nexit 0\n")
        (stub / tool).chmod(0o755)
    env = {"PATH": f"{stub}:/usr/bin:/bin"}
    root = str(tmp_path / "esp")
    ok = on_esp("4A1C-9E2B", 'test -d "$M"').replace(ESP_MOUNTS, root)
    bad = on_esp("4A1C-9E2B", "false").replace(ESP_MOUNTS, root)
    assert subprocess.run(["sh", "-c", ok], env=env).returncode == 0
    assert subprocess.run(["sh", "-c", bad], env=env).returncode != 0
    assert not (tmp_path / "esp" / "4A1C-9E2B").exists()


def test_systemd_boot_refused_when_this_boot_did_not_use_it() -> None:
    path = parse_boot_path(proxmox("boot-path-systemd-boot.out"))
    path = replace(path, efivars={})
    tool = parse_boot_tool_status(proxmox("boot-tool-status-uefi.out"))
    trial = plan_trial_boot(OLD, NEW, path, tool)
    assert trial.method == "systemd-boot" and not trial.can_apply
    assert "LoaderInfo" in (trial.refusal or "") and trial.oneshot == ()
    # GRUB 2.12 (Debian 13) is a Boot Loader Interface loader too, without a one-shot
    grub_started = replace(path, efivars={"LoaderInfo": "GRUB 2.12"})
    assert not grub_started.systemd_boot_started
    trial = plan_trial_boot(OLD, NEW, grub_started, tool)
    assert not trial.can_apply and "'GRUB 2.12'" in (trial.refusal or "")


def test_systemd_boot_refused_without_bootctl() -> None:
    """Proxmox VE 9 keeps bootctl in systemd-boot-tools; a host without it has no one-shot."""
    path = parse_boot_path([*proxmox("boot-path-systemd-boot.out"), "bootctl no"])
    assert path.bootctl is False
    tool = parse_boot_tool_status(proxmox("boot-tool-status-uefi.out"))
    trial = plan_trial_boot(OLD, NEW, path, tool, options="root=ZFS=rpool/ROOT/pve-1")
    assert trial.method == "systemd-boot" and not trial.can_apply
    assert "apt install systemd-boot-tools" in (trial.refusal or "")
    assert trial.oneshot == ()
    with_it = replace(path, bootctl=True)
    assert plan_trial_boot(OLD, NEW, with_it, tool, options="root=ZFS=rpool/ROOT/pve-1").can_apply


@pytest.mark.parametrize("make", [systemd_boot, grub_esp, grub_plain, grub_lvm])
def test_never_the_next_boot_pin(make) -> None:  # type: ignore[no-untyped-def]
    trial = make(without_oneshot=True)
    assert trial.can_apply
    assert not any("--next-boot" in c for c in every_command(trial))
    assert trial.pin_running[0] == "rm -f /etc/kernel/next-boot-pin"
    # no hardware watchdog (nmi_watchdog=panic in the trial entry's options is the kernel's own)
    commands = [c.replace("nmi_watchdog=panic", "") for c in every_command(trial)]
    assert not any("watchdog" in c.lower() for c in commands)


def test_trial_command_line_and_deadline() -> None:
    trial = systemd_boot(panic_timeout=15, deadline_minutes=30)
    assert trial.cmdline == (
        "panic=15",
        "oops=panic",
        "softlockup_panic=1",
        "nmi_watchdog=panic",
        "hung_task_panic=1",
        TRIAL_MARK,
        # the backstop (files/gpuhost-trial-backstop): after the timer's deadline, by boot time
        f"gpuhost.trial_deadline={30 * 60 + 60}",
    )
    assert (trial.deadline_s, trial.before_deadline_reboot) == (30 * 60, ())
    assert trial.confirm[0] == f'test "$(uname -r)" = {NEW}'
    assert trial.summary == (
        f"trial boot of {NEW} via systemd-boot one-shot '{TRIAL_ENTRY}', "
        f"{OLD} pinned until the checks pass"
    )


def test_unknown_path_and_full_boot_are_refused() -> None:
    from gpuhost.observe.boot import BootPathInfo

    unknown = plan_trial_boot(OLD, NEW, BootPathInfo(), None)
    assert unknown.method == "unknown" and "capture the facts again" in (unknown.refusal or "")
    full = replace(parse_boot_path(proxmox("boot-path-grub-plain.out")), boot_free=100 * 2**20)
    trial = plan_trial_boot(OLD, NEW, full, UNCONFIGURED)
    assert "/boot has 100 MiB free" in (trial.refusal or "")
    assert trial.summary.startswith(f"trial boot of {NEW} refused (grub): /boot has 100 MiB")


def test_values_from_the_host_are_checked_before_reaching_a_shell() -> None:
    path = replace(parse_boot_path(proxmox("boot-path-grub-plain.out")), grub_devid="x; reboot")
    trial = plan_trial_boot(OLD, NEW, path, UNCONFIGURED)
    assert not trial.can_apply and "gnulinux-advanced-<id>" in (trial.refusal or "")
    bad = plan_trial_boot("6.8.12-9-pve; reboot", NEW, path, UNCONFIGURED)
    assert "not a Proxmox kernel release" in (bad.refusal or "")


@pytest.mark.parametrize("make", [systemd_boot, grub_esp, grub_plain])
def test_the_backstop_is_in_the_trial_initramfs_only_for_the_trial(make) -> None:
    """Written (executable, under /etc/initramfs-tools/scripts, where mkinitramfs orders it)
    right before the trial's initramfs is made; gone before the commit rebuilds the kernel's own
    initramfs, and after an abandon (gpuhost/plan/trial/backstop.py)."""
    trial = make(running=NEW)  # a new command line on the running kernel: a trial entry
    prepare = list(trial.prepare)
    write = next(i for i, c in enumerate(prepare) if BACKSTOP_SCRIPT in c and "printf" in c)
    made = next(i for i, c in enumerate(prepare) if c.startswith("mkinitramfs -o"))
    assert write < made and "chmod 755" in prepare[write]
    commit = list(trial.commit)
    dropped = commit.index(drop_backstop())
    assert dropped < next(i for i, c in enumerate(commit) if c.startswith("update-initramfs"))
    assert drop_backstop() in trial.abandon
    assert TRIAL_DEADLINE in (trial.entry_options or "")
