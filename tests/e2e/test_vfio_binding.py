"""The VMs' GPUs on vfio-pci by BDF, claimed at boot by gpuhost's modprobe install hook.

On a kpro6 twin with the driver installed (which models the race: a udev rule alone loses),
the deploy writes the modprobe.d install lines that claim the boards, rebuilds the initramfs
(which carries them) and reboots once: VM 129's boards (0000:c1:00.0, 0000:e1:00.0 and their
audio functions) come up on vfio-pci, every other GPU on nvidia, and the audit's binding check
passes; a second run changes nothing. The hook also wins when nvidia is loaded by udev's
modalias autoload alone (no modules-load.d entry) and when it is loaded in the initramfs.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import deploy, inventory, with_driver
from tests.e2e.guests import audit
from tests.e2e.test_boot_slice import KPRO6
from twin.pytest_plugin import TwinHandle

VM_FUNCTIONS = ("0000:c1:00.0", "0000:c1:00.1", "0000:e1:00.0", "0000:e1:00.1")
HOST_GPUS = ("0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0")
HOST_GPUS += ("0000:81:00.0", "0000:a1:00.0")


def drivers(twin: TwinHandle, bdfs: tuple[str, ...]) -> dict[str, str]:
    script = "; ".join(
        f"echo {b} $(basename $(readlink /sys/bus/pci/devices/{b}/driver) 2>/dev/null)"
        for b in bdfs
    )
    _, out, _ = twin.run(script)
    return dict(line.split(" ", 1) if " " in line else (line, "") for line in out.splitlines())


def assert_split(twin: TwinHandle) -> None:
    assert drivers(twin, VM_FUNCTIONS) == dict.fromkeys(VM_FUNCTIONS, "vfio-pci")
    assert drivers(twin, HOST_GPUS) == dict.fromkeys(HOST_GPUS, "nvidia")
    rc, out, _ = twin.run("nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader")
    assert rc == 0 and len(out.splitlines()) == 6 and "C1:00.0" not in out.upper()


@pytest.fixture(scope="module")
def deployed(twin_fleet, modules, tmp_path_factory):
    (twin,) = twin_fleet.start(1, "kpro6")
    try:
        with_driver(twin, modules, KPRO6["driver"]["version"])
        assert drivers(twin, ("0000:c1:00.0",)) == {"0000:c1:00.0": "nvidia"}
        inv = inventory(tmp_path_factory.mktemp("vfio") / "inv.py", twin, KPRO6)
        first = deploy(inv)
        assert first.rc == 0, first.output[-4000:]
        assert first.reboots == 1, first.output[-4000:]
        assert "GPU 0000:c1:00.0 binds vfio-pci (now nvidia)" in first.output
        twin.reconnect()
        yield twin, inv
    finally:
        twin_fleet.stop(twin)


def test_the_deploy_binds_the_vms_boards_to_vfio_pci(deployed) -> None:
    twin, inv = deployed
    assert_split(twin)
    _, out, _ = twin.run("cat /sys/bus/pci/devices/0000:c1:00.1/driver_override")
    assert out == "vfio-pci\n"
    # the initramfs (rebuilt, synced to the ESP) carries the claim too
    _, out, _ = twin.run("cat /var/lib/gpuhost-twin/bootcfg.json")
    _, kver, _ = twin.run("uname -r")
    record = json.loads(out)["initrd"][kver.strip()]
    _, conf, _ = twin.run("cat /etc/modprobe.d/gpuhost-vfio.conf")
    assert record["files"]["/etc/modprobe.d/gpuhost-vfio.conf"] == conf
    assert "install nvidia { for f in 0000:c1:00.0 0000:c1:00.1 0000:e1:00.0 0000:e1:00.1;" in conf
    failed = audit(twin, inv)
    assert "gpus.binding" not in failed, json.dumps(failed, indent=1)
    assert "modules.loaded" not in failed, json.dumps(failed, indent=1)
    assert "modules.files" not in failed, json.dumps(failed, indent=1)  # gpuhost-vfio.conf too
    second = deploy(inv)
    assert second.rc == 0, second.output[-4000:]
    assert not second.changed and second.reboots == 0, second.output[-4000:]


def test_the_hook_wins_when_udev_autoload_loads_nvidia(deployed) -> None:
    twin, _ = deployed
    conf = "/etc/modules-load.d/gpuhost-nvidia.conf"
    rc, saved, _ = twin.run(f"cat {conf} && rm {conf}")
    assert rc == 0
    try:
        twin.reboot()
        assert_split(twin)  # the host's GPUs on nvidia: coldplug's autoload loaded it
    finally:
        twin.run(f"cat > {conf} <<'EOF'\n{saved}EOF")


def test_the_hook_wins_when_the_initramfs_loads_nvidia(deployed) -> None:
    twin, _ = deployed
    rc, _, err = twin.run(
        "mkdir -p /etc/initramfs-tools && touch /etc/initramfs-tools/modules && cp /etc/initramfs-tools/modules /root/modules.saved && "
        "echo nvidia >> /etc/initramfs-tools/modules && update-initramfs -u -k all"
    )
    assert rc == 0, err
    try:
        twin.reboot()
        assert_split(twin)
        _, hw, _ = twin.run("cat /var/lib/gpuhost-twin/hw.json")
        assert json.loads(hw)["initramfs"] == "esp"
    finally:
        twin.run(
            "mv /root/modules.saved /etc/initramfs-tools/modules && update-initramfs -u -k all"
        )


def test_the_hook_wins_when_nvidia_declares_a_softdep_kmod_resolves(deployed, modules) -> None:
    """kmod runs no install command for a module with a softdep it can resolve. The real
    nvidia.ko's own (pre: ecdh_generic,ecdsa_generic) resolves nothing because of its comma;
    with the list written as kmod reads it, and both modules there, the claim must still run:
    gpuhost's empty softdep comes first, and its command loads the two before nvidia."""
    twin, _ = deployed
    kver = twin.run("uname -r")[1].strip()
    dkms = twin.root / f"lib/modules/{kver}/updates/dkms"
    saved = (dkms / "nvidia.ko").read_bytes()
    version = KPRO6["driver"]["version"]
    well_formed = modules.ko(
        "nvidia", kver, version=version, softdep="pre: ecdh_generic ecdsa_generic"
    )
    (dkms / "nvidia.ko").write_bytes(well_formed.read_bytes())
    for name in ("ecdh_generic", "ecdsa_generic"):
        (dkms / f"{name}.ko").write_bytes(modules.ko(name, kver, softdep="").read_bytes())
    try:
        rc, _, err = twin.run("depmod")  # real depmod: modules.softdep from the modules
        assert rc == 0, err
        _, softdeps, _ = twin.run(f"cat /lib/modules/{kver}/modules.softdep")
        assert "softdep nvidia pre: ecdh_generic ecdsa_generic" in softdeps
        twin.reboot()
        assert_split(twin)
        _, lsmod, _ = twin.run("lsmod")
        assert {"ecdh_generic", "ecdsa_generic", "nvidia"} <= {
            line.split()[0] for line in lsmod.splitlines()[1:]
        }
    finally:
        (dkms / "nvidia.ko").write_bytes(saved)
        for name in ("ecdh_generic", "ecdsa_generic"):
            (dkms / f"{name}.ko").unlink(missing_ok=True)
        twin.run("depmod")
        twin.reboot()
