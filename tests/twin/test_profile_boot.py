"""A twin with a hardware profile: the plumbing installs hardware and Proxmox before the first boot
and runs the simulated boot at every boot (the simulation itself is tested with its own modules)."""

import pytest

pytest.importorskip("twin.hardware", reason="twin/hardware.py has not landed yet")
pytest.importorskip("twin.boot", reason="twin/boot.py has not landed yet")
if not hasattr(pytest.importorskip("twin.pve"), "install"):
    pytest.skip("twin.pve.install has not landed yet", allow_module_level=True)

twin_profile = "kpro6"


def test_first_boot_is_simulated(twin):
    rc, out, err = twin.run("cat /proc/cmdline /proc/version; uname -n")
    assert rc == 0, err
    assert out.splitlines()[-1] == twin.name
    assert twin.run("test -d /etc/pve")[0] == 0


def test_every_boot_is_simulated(twin):
    before = twin.run("cat /proc/sys/kernel/random/boot_id /proc/version")[1]
    twin.reboot()
    rc, after, _ = twin.run("cat /proc/sys/kernel/random/boot_id /proc/version")
    assert rc == 0
    assert after.split()[0] != before.split()[0]
    assert not (twin.twin.dir / "boot-error").exists(), (twin.twin.dir / "boot-error").read_text()


def test_bootctl_oneshot_over_ssh_is_consumed_by_the_next_boot(twin):
    # the recipe of docs/reference/trial-boot.md §1.4, as a deploy would run it on the twin
    g = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
    old = twin.run("uname -r")[1].strip()
    rc, out, err = twin.run(
        f"proxmox-boot-tool kernel pin {old} && proxmox-boot-tool refresh >/dev/null 2>&1"
        " && ls /boot/vmlinuz-* | sed 's,.*/vmlinuz-,,'"
    )
    assert rc == 0, err
    new = next(k for k in out.split() if k.startswith("6.") and k != old)
    assert twin.run(f"bootctl set-oneshot proxmox-{new}.conf") == (0, "", "")
    read_back = (
        f"cat /sys/firmware/efi/efivars/LoaderEntryOneShot-{g} | tail -c +5"
        " | iconv -f UTF-16LE -t UTF-8 | tr -d '\\0'"
    )
    assert twin.run(read_back)[1] == f"proxmox-{new}.conf"
    twin.reboot()
    assert twin.run("uname -r")[1].strip() == new
    assert twin.run(f"test ! -e /sys/firmware/efi/efivars/LoaderEntryOneShot-{g}")[0] == 0
    twin.reboot()
    assert twin.run("uname -r")[1].strip() == old
