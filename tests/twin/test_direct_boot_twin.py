"""A twin of a machine without a boot loader (twin/profile_boot.py boot.loader none), made from
the h200x1 capture as `gpuhost rehearse` makes it: the hypervisor's kernel with its command line
at every boot, and none of a loader's files (tests/fixtures/captures/h200x1-boot-raw)."""

from __future__ import annotations

from pathlib import Path

from gpuhost.observe.hostfacts import parse_raw, read_snapshot
from twin.fromcapture import profile_from_snapshot, write_profile

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = "tests/fixtures/captures/h200x1/facts"


def test_the_hypervisor_boots_the_same_kernel_every_time(twin_fleet, tmp_path):
    raw = read_snapshot(ROOT / CAPTURE)
    facts = parse_raw(raw)
    write_profile(profile_from_snapshot(raw, name="h200x1", source=CAPTURE), tmp_path / "p.yaml")
    (twin,) = twin_fleet.start(1, str(tmp_path / "p.yaml"))
    try:
        cmdline = " ".join(facts.cmdline)  # no BOOT_IMAGE=: nothing put a loader's word first
        assert twin.run("cat /proc/cmdline")[1].strip() == cmdline
        assert twin.run("uname -r")[1].strip() == facts.kernel.release
        # no loader's files, tools or ESPs (as on the machine: no /boot/grub, no EFI)
        absent = "/boot/grub /etc/default/grub /etc/kernel/cmdline /etc/kernel/proxmox-boot-uuids"
        absent += " /sys/firmware/efi /var/lib/gpuhost-twin/esp"
        _, out, _ = twin.run(
            f"ls -d {absent} 2>/dev/null; grep -l 'gpuhost twin' $(command -v update-grub)"
        )
        assert out.strip() == "", out  # no simulated update-grub (the base's grub2-common stays)
        # the base's real update-grub fails (grub-probe cannot resolve the twin's overlay root),
        # as update-grub does on the machine (not installed there: exit 127); no /boot/grub
        assert twin.run("update-grub")[0] != 0 and twin.run("test -e /boot/grub")[0] != 0
        # what would steer a loader has nothing to act on: the same kernel and line come back
        twin.run(
            "mkdir -p /boot/grub && printf 'next_entry=x\\n' > /boot/grub/grubenv"
            " && echo 6.8.12-9-pve > /etc/kernel/proxmox-boot-pin"
        )
        twin.reboot()
        assert twin.run("uname -r")[1].strip() == facts.kernel.release
        assert twin.run("cat /proc/cmdline")[1].strip() == cmdline
    finally:
        twin_fleet.stop(twin)
