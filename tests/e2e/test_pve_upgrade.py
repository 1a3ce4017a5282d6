"""A kpro6 host deployed on Proxmox VE 8 is upgraded in place to 9 (twin/upgrade.py: trixie's
userland, the PVE 9 packages and kernel 6.14.8-2-pve beside the old kernels, the pin and every
file under /etc kept), as Proxmox's "Upgrade from 8 to 9" does. Then, from the host's facts:
the PVE 8 spec is refused naming kernel.version and toolchain.gcc; the audit with the upgraded
spec names what must be re-deployed; after the deploy the audit passes and a second run changes
nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.conftest import deploy, inventory
from tests.e2e.guests import (
    SPEC,
    VERSION,
    audit,
    deploy_host,
    give_readiness,
    place_guests,
)
from tests.e2e.test_pve9 import KERNEL, PVE9_SPEC
from tests.e2e.test_pve9 import trixie_modules as trixie_modules  # a fixture
from twin.upgrade import upgrade

OLD_KERNEL = "6.14.8-2-bpo12-pve"  # SPEC's kernel: Proxmox's 6.14 backport for Debian 12


def test_a_pve8_host_upgraded_to_pve9_is_redeployed_from_what_the_audit_names(
    fresh, modules, trixie_modules, tmp_path: Path
) -> None:
    twin = fresh("kpro6")
    inv8 = tmp_path / "kpro6.py"
    deploy_host(twin, modules, inv8, SPEC)
    place_guests(twin)
    give_readiness(twin, inv8)  # what the deploy gives guests placed after it
    twin.run("echo 'onboot: 1' >> /etc/pve/lxc/200.conf")  # it comes back after each reboot

    upgrade(twin.name, "kpro6-pve9")
    twin.reconnect()
    host = twin.host
    assert host.file("/etc/os-release").contains("VERSION_CODENAME=trixie")
    assert twin.run("dpkg-query -W -f '${Version}' pve-manager")[1] == "9.0.10"
    # The pin survives the upgrade: the host still runs the PVE 8 kernel and its modules.
    assert twin.run("uname -r")[1].strip() == OLD_KERNEL
    assert host.file("/etc/kernel/proxmox-boot-pin").content_string.strip() == OLD_KERNEL
    assert host.file(f"/boot/vmlinuz-{KERNEL}").exists
    assert host.file("/etc/modprobe.d/gpuhost-nvidia.conf").exists
    assert not host.exists("gcc-12")
    modules_now = set(twin.run("find /lib/modules -name 'nvidia*.ko'")[1].split())
    assert modules_now == {f"/lib/modules/{OLD_KERNEL}/updates/dkms/{m}.ko"
                           for m in ("nvidia", "nvidia-uvm")}  # fmt: skip
    assert "VERSION_CODENAME=bookworm" in twin.run("pct exec 200 -- cat /etc/os-release")[1]

    # The PVE 8 spec: every check reports the plan's refusal, naming the fields and the fix.
    refused = {p for found in audit(twin, inv8).values() for p in found}
    assert any(p.startswith(f"kernel.version {OLD_KERNEL} is a kernel of the release before") and
               f"set kernel.version: {KERNEL}" in p for p in refused), refused  # fmt: skip
    assert any(p.startswith("toolchain.gcc 12.2.0 is the compiler of the release before") and
               "toolchain.gcc: 14.2.0" in p for p in refused), refused  # fmt: skip

    inv9 = inventory(tmp_path / "kpro6-pve9.py", twin, PVE9_SPEC)
    gaps = audit(twin, inv9, "fix")
    redeploy = "re-run the deploy (pyinfra INVENTORY deploys/gpu_host.py)"
    assert gaps == {
        "boot.kernel": [f"{redeploy}: it installs {KERNEL} and boots it through a trial boot"],
        "driver.release": [
            f"{redeploy}: it trial-boots {KERNEL} and pins it",
            f"build the NVIDIA {VERSION} modules for {KERNEL} with gcc-14 (driver.source, or the "
            f"driver's installer), then {redeploy}",
        ],
    }, json.dumps(gaps, indent=1)

    # The NVIDIA modules for the new kernel, built by gcc-14 (stands for the driver install)
    trixie_modules.install(twin.root, KERNEL, version=VERSION)
    token = {"GPUHOST_PVE_TOKEN": (twin.twin.dir / "api-token").read_text().strip()}
    first = deploy(inv9, env=token)
    assert first.rc == 0, first.output[-3000:]
    assert first.reboots == 1, first.output[-3000:]  # the trial boot of 6.14.8-2-pve
    assert "upgraded host: Proxmox VE 9.0.10 on Debian 13 (trixie)" in first.output
    twin.reconnect()  # the trial boot dropped testinfra's session
    assert twin.run("uname -r")[1].strip() == KERNEL
    assert twin.host.file("/proc/driver/nvidia/version").contains("gcc version 14.2.0")
    failed = audit(twin, inv9)
    assert failed == {}, json.dumps(failed, indent=1)
    second = deploy(inv9, env=token)
    assert second.rc == 0, second.output[-3000:]
    assert second.reboots == 0 and not second.changed, second.output[-3000:]
