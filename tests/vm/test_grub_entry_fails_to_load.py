"""gpuhost's GRUB trial entry, as the plan renders it (grub_trial_script), on real GRUB 2.06 when
its initramfs is gone by the time GRUB reads it: the entry's `initrd` fails and the entry reboots
(next_entry was spent when grub.cfg loaded) instead of waiting at "Press any key to continue";
the firmware and GRUB then boot the default entry, with no console input."""

from __future__ import annotations

import re

from gpuhost.plan.trial.entry import TRIAL_INITRD_DIR
from gpuhost.plan.trial.grub import (
    BACK_TO_DEFAULT,
    GRUB_TRIAL_ID,
    GRUB_TRIAL_SCRIPT,
    grub_trial_script,
)
from twin.vm.qemu import BOOT_TIMEOUT


def test_a_trial_entry_grub_cannot_load_reboots_into_the_default(booted) -> None:
    vm = booted("grub")
    kver = vm.image.kernels[-1]
    script = grub_trial_script(kver, f"root=UUID={vm.image.root_uuid} ro console=ttyS0,115200")
    vm.ssh(f"mkdir -p {TRIAL_INITRD_DIR} && cp /boot/initrd.img-{kver} {TRIAL_INITRD_DIR}/")
    vm.ssh(f"cat > {GRUB_TRIAL_SCRIPT} && chmod 755 {GRUB_TRIAL_SCRIPT}", input=script)
    vm.ssh("update-grub 2>&1")
    assert f"'{GRUB_TRIAL_ID}'" in vm.ssh("cat /boot/grub/grub.cfg").stdout
    vm.ssh(f"rm -r {TRIAL_INITRD_DIR} && grub-reboot {GRUB_TRIAL_ID}")
    start = vm.reboot(BOOT_TIMEOUT)
    vm.wait_console(r"Booting `gpuhost trial of Linux", 10, since=start)
    vm.wait_console(r"error: .*not found", 10)  # GRUB's own words for the missing file
    vm.wait_console(re.escape(BACK_TO_DEFAULT), 10)
    vm.wait_console(r"Booting `Debian GNU/Linux'", 10)  # entry 0: no pin without a deploy
    assert "gpuhost" not in vm.ssh("cat /proc/cmdline").stdout
    # GRUB's own save_env emptied next_entry as it loaded grub.cfg, before the entry failed
    env = vm.ssh("grub-editenv /boot/grub/grubenv list").stdout.splitlines()
    assert "next_entry=" in env and f"next_entry={GRUB_TRIAL_ID}" not in env
