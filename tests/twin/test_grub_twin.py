"""A plain-GRUB twin (/boot on LVM): the real grub-reboot writes the twin's grubenv, and the
entry sticks across boots because GRUB cannot save_env there (docs/reference/trial-boot.md §2.3)."""

twin_profile = "lumped"


def test_grub_reboot_next_entry_sticks_on_lvm(twin):
    kver = twin.run("uname -r")[1].strip()
    rc, devid, err = twin.run(
        'sed -rn "s/.*gnulinux-advanced-(.+)[\'] \\{$/\\1/p" /boot/grub/grub.cfg'
    )
    assert rc == 0 and devid.strip(), err
    entry = f"gnulinux-advanced-{devid.strip()}>gnulinux-{kver}-advanced-{devid.strip()}"
    rc, _, err = twin.run(f"grub-reboot '{entry}'")
    assert rc == 0, err
    listing = twin.run("grub-editenv /boot/grub/grubenv list")[1]
    assert listing == f"next_entry={entry}\n"
    assert twin.run("wc -c < /boot/grub/grubenv")[1].strip() == "1024"
    twin.reboot()
    assert twin.run("uname -r")[1].strip() == kver
    assert twin.run("grub-editenv /boot/grub/grubenv list")[1] == listing  # not cleared
