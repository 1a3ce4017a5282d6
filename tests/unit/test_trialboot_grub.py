"""Trial boot planning on GRUB (on ESPs, on a partition, /boot on LVM; docs/reference/trial-boot.md
§2), on the BootPath and proxmox-boot-tool outputs of tests/fixtures/proxmox/facts."""

import shlex
from pathlib import Path

from gpuhost.plan.trial.backstop import drop_backstop
from gpuhost.plan.trial.esp import grub_entry, grub_has
from gpuhost.plan.trial.grub import GRUB_TRIAL_ID, GRUB_TRIAL_SCRIPT, grub_trial_options
from gpuhost.plan.trial.params import TRIAL_MARK
from tests.unit.trialboots import (
    NEW,
    OLD,
    PLAIN_DEVID,
    PLANNED_GRUB,
    ZFS_DEVID,
    every_command,
    grub_esp,
    grub_lvm,
    grub_plain,
)


def test_grub_on_esps_sets_next_entry_on_every_esp() -> None:
    trial = grub_esp()
    entry = GRUB_TRIAL_ID
    assert (trial.method, trial.can_apply, trial.entry) == ("grub-esp", True, entry)
    sets = [c for c in trial.oneshot if "grub-editenv" in c]
    assert len(sets) == 1  # one ESP in this host
    assert f"next_entry={entry}" in sets[0] and '"$M/grub/grubenv"' in sets[0]
    assert "grep -qxF" in sets[0]  # read back
    assert "/boot/grub/grubenv" not in " ".join(trial.oneshot)  # plain grub-reboot: wrong file
    assert any(f"'gnulinux-{NEW}-advanced-{ZFS_DEVID}'" in c for c in trial.prepare)
    # the ESPs not booted keep their next_entry: the commit clears every one
    assert any("unset next_entry" in c and "8C2E-11D0" in c for c in trial.commit)
    assert f"proxmox-boot-tool kernel pin {NEW}" in trial.commit
    # the trial's initramfs on every ESP (GRUB's /boot there), its entry in every ESP's grub.cfg
    assert any('"$M/gpuhost-trial/"' in c and "8C2E-11D0" in c for c in trial.prepare)
    # one refresh renders the new kernel's entry and the trial's, then both are checked
    assert trial.prepare.count("proxmox-boot-tool refresh") == 1
    render = trial.prepare.index("proxmox-boot-tool refresh")
    assert GRUB_TRIAL_SCRIPT in trial.prepare[render - 1]
    assert f"'{GRUB_TRIAL_ID}'" in trial.prepare[render + 1]
    assert '"$M/grub/grub.cfg"' in trial.prepare[render + 1]
    assert f"'gnulinux-{NEW}-advanced-{ZFS_DEVID}'" in trial.prepare[-1]  # the kernel's own
    assert grub_entry(NEW, ZFS_DEVID) in trial.commit[-1] and "! grep" in trial.commit[-1]
    # the commit's refresh (after the pin) also drops the trial entry: one render, not two
    assert trial.commit.count("proxmox-boot-tool refresh") == 1
    assert trial.commit.index("proxmox-boot-tool refresh") > trial.commit.index(
        f"proxmox-boot-tool kernel pin {NEW}"
    )
    assert max(i for i, c in enumerate(trial.commit) if GRUB_TRIAL_SCRIPT in c) < (
        trial.commit.index("proxmox-boot-tool refresh")
    )


def test_plain_grub_on_a_partition_has_a_one_shot() -> None:
    trial = grub_plain()
    assert (trial.method, trial.can_apply, trial.entry) == ("grub", True, GRUB_TRIAL_ID)
    assert trial.oneshot[-2:] == (
        f"grub-editenv /boot/grub/grubenv set next_entry={GRUB_TRIAL_ID}",
        f"grub-editenv /boot/grub/grubenv list | grep -qxF next_entry={GRUB_TRIAL_ID}",
    )
    assert "! grub-editenv /boot/grub/grubenv list | grep -q '^next_entry=.'" in trial.confirm
    assert trial.confirm[-1] == f"grep -qw {TRIAL_MARK} /proc/cmdline"
    # the trial's initramfs and menu entry; the fallback (the pinned old kernel) stays default
    assert f"mkinitramfs -o /boot/gpuhost-trial/initrd.img-{NEW} {NEW}" in trial.prepare
    put = next(c for c in trial.prepare if GRUB_TRIAL_SCRIPT in c)
    assert "chmod 755" in put and trial.entry_options and trial.entry_options in put
    has_entry = "grep -qF " + shlex.quote(f"'{GRUB_TRIAL_ID}'") + " /boot/grub/grub.cfg"
    # one update-grub renders the trial entry (and a new kernel's own), then both are checked
    assert trial.prepare.count("update-grub") == 1
    render = trial.prepare.index("update-grub")
    assert GRUB_TRIAL_SCRIPT in trial.prepare[render - 1]
    assert trial.prepare[render + 1 :] == (
        f"{has_entry} && "
        f"grep -qF 'set default=\"{grub_entry(OLD, PLAIN_DEVID)}\"' /boot/grub/grub.cfg",
        grub_has(NEW, PLAIN_DEVID, "/boot/grub/grub.cfg"),
    )
    # commit: the target's initramfs, the entry gone, then the new kernel pinned as default
    assert trial.commit[:2] == (drop_backstop(), f"update-initramfs -u -k {NEW}")
    assert not any("-k all" in c for c in every_command(trial))
    pin = trial.commit.index(f"proxmox-boot-tool kernel pin {NEW}")
    assert trial.commit.index("rm -rf /boot/gpuhost-trial") < pin
    # on plain GRUB the pin runs update-grub (docs/reference/trial-boot.md §2.5): that render
    # drops the entry
    assert "update-grub" not in trial.commit
    assert grub_entry(NEW, PLAIN_DEVID) in trial.commit[pin + 1]
    assert trial.commit[-1] == (  # no trial entry left in grub.cfg, the new kernel the default
        f"! {has_entry} && grep -qF 'set default=\"{grub_entry(NEW, PLAIN_DEVID)}\"' "
        "/boot/grub/grub.cfg"
    )
    assert trial.abandon[0] == "grub-editenv /boot/grub/grubenv unset next_entry"
    assert trial.abandon[-1] == "update-grub" and f"rm -f {GRUB_TRIAL_SCRIPT}" in trial.abandon[1]


def test_grub_trial_options_are_what_10_linux_renders_from_the_planned_files() -> None:
    files = {
        "/etc/default/grub": 'GRUB_CMDLINE_LINUX_DEFAULT="quiet mitigations=off"\n'
        'GRUB_CMDLINE_LINUX=""\n',
        "/etc/default/grub.d/zz-gpuhost.cfg": 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX '
        'intel_iommu=on"\n',
        "/etc/default/grub.d/gone.cfg": None,
    }
    running = ["BOOT_IMAGE=/boot/vmlinuz-6.8.12-9-pve", "root=/dev/mapper/pve-root", "ro", "quiet"]
    options = grub_trial_options(running, files)
    assert options == "root=/dev/mapper/pve-root ro intel_iommu=on quiet mitigations=off"
    # a parameter GRUB's parser would read itself is refused, not written into grub.cfg
    bad = grub_plain(running=NEW, options=f"{PLANNED_GRUB} dyndbg='file x +p'")
    assert not bad.can_apply and "cannot go into GRUB's trial entry" in (bad.refusal or "")


def test_lvm_grub_is_refused_with_the_reason_and_both_ways_out() -> None:
    trial = grub_lvm()
    assert (trial.method, trial.can_apply) == ("grub-no-oneshot", False)
    refusal = trial.refusal or ""
    assert "/dev/mapper/pve-root" in refusal and "cannot clear next_entry" in refusal
    assert "proxmox-boot-tool init" in refusal  # way out 1: GRUB on an ESP
    assert "kernel.trial.without_oneshot: true" in refusal and "console" in refusal  # way out 2
    assert trial.oneshot == () and trial.commit == ()  # nothing to run, no silent sticky default


def test_lvm_grub_refuses_a_new_command_line_too_unless_accepted() -> None:
    refused = grub_lvm(running=NEW)
    assert refused.same_kernel and not refused.can_apply
    assert "the trial entry would stay the default" in (refused.refusal or "")
    assert "kernel.trial.without_oneshot: true" in (refused.refusal or "")
    accepted = grub_lvm(running=NEW, without_oneshot=True)
    assert accepted.can_apply and accepted.entry == GRUB_TRIAL_ID
    assert "grub-editenv /boot/grub/grubenv unset next_entry" in accepted.commit


def test_lvm_grub_with_the_opt_in_clears_next_entry_itself() -> None:
    trial = grub_lvm(without_oneshot=True)
    assert (trial.method, trial.can_apply) == ("grub-no-oneshot", True)
    assert trial.before_deadline_reboot == ("grub-editenv /boot/grub/grubenv unset next_entry",)
    assert any("console" in n for n in trial.notes)
    assert any("next-boot-pin" in n for n in trial.notes)  # the stale one in this capture
    # GRUB cannot clear it there, so the confirm does not expect it gone; the commit clears it
    assert not any("next_entry=." in c for c in trial.confirm)
    assert "grub-editenv /boot/grub/grubenv unset next_entry" in trial.commit
    # the deadline script (files/gpuhost-trial-deadline) runs exactly this before its reboot
    script = (Path(__file__).parents[2] / "files/gpuhost-trial-deadline").read_text()
    assert all(f"  {c}\n" in script for c in trial.before_deadline_reboot)
