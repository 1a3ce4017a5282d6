"""A twin with a hardware profile: the plumbing installs hardware and Proxmox before the first boot
and runs the simulated boot at every boot (the simulation itself is tested with its own modules)."""

import pytest

pytest.importorskip("twin.hardware", reason="twin/hardware.py has not landed yet")
pytest.importorskip("twin.boot", reason="twin/boot.py has not landed yet")
if not hasattr(pytest.importorskip("twin.pve"), "install"):
    pytest.skip("twin.pve.install has not landed yet", allow_module_level=True)

pytestmark = pytest.mark.twin
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
