"""A fleet in one inventory, through the real pyinfra CLI: two kpro6 twins that both trial-boot a
new kernel are deployed one after another, in inventory order (deploys/rollout.py), and when the
first one's trial fails the second is left exactly as it was: no file changed, no reboot.

"One after another" is read off the twins themselves, not pyinfra's log: the second twin's
first change (every file gpuhost wrote there) is later than the first twin's commit (its kernel
pin), and its trial boot (the boot's own record) later still."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.conftest import Deploy, deploy, manifest
from tests.e2e.reprovision import OLD, fresh_kpro6
from tests.e2e.test_trial_deploy import (
    NEW,
    PATHS,
    TREE,
    VERSION,
    pinned,
    plant_firmware,
    unpack_kernel,
)
from twin import userspace
from twin.pytest_plugin import TwinHandle

PIN = "etc/kernel/proxmox-boot-pin"


def trial_host(fresh, tmp: Path, firmware: str = VERSION) -> TwinHandle:
    """A fresh kpro6 twin with the new kernel unpacked and the driver's userspace (as
    tests/e2e/test_trial_deploy.py's trial twins)."""
    tmp.mkdir(parents=True, exist_ok=True)
    twin = fresh(fresh_kpro6(tmp, PATHS["systemd-boot"]))
    unpack_kernel(twin, NEW)
    userspace.install_root(twin.root, VERSION)
    plant_firmware(twin.root, firmware)
    return twin


def fleet_inventory(path: Path, twins: list[TwinHandle], store: Path) -> Path:
    spec = {
        "kernel": {"version": NEW, "keep": [OLD]},
        "toolchain": {"gcc": "12.2.0"},
        "driver": {"version": VERSION, "source": {"tree": str(TREE), "store": str(store)}},
    }
    hosts = ", ".join(
        f"gpu_host({t.name!r}, {spec!r}, ssh_hostname={t.address!r}, ssh_user='root', "
        f"ssh_key={str(t.key)!r}, ssh_known_hosts_file={str(t.known_hosts)!r}, "
        "ssh_strict_host_key_checking='yes', gpuhost_reboot_delay=1)"
        for t in twins
    )
    path.write_text(f"from gpuhost.spec.inventory import gpu_host\nhosts = [{hosts}]\n")
    return path


def booted_at(twin: TwinHandle) -> float:
    return json.loads((twin.root / "var/lib/gpuhost-twin/hw.json").read_text())["booted_at"]


def gpuhost_writes(twin: TwinHandle) -> list[float]:
    """mtimes of the files the deploy writes on a twin (its state, drop-ins, loader files)."""
    root = twin.root
    paths = [
        *root.glob("etc/modprobe.d/gpuhost-*"),
        *root.glob("etc/modules-load.d/gpuhost-*"),
        *root.glob("etc/systemd/system/gpuhost-*"),
        *root.glob("etc/gpuhost/*"),
        root / "etc/kernel/cmdline",
        *root.glob(f"lib/modules/{NEW}/updates/gpuhost/*.ko"),
    ]
    return [p.lstat().st_mtime for p in paths if p.exists()]


def test_trial_boots_go_one_host_after_another(fresh, tmp_path):
    first, second = trial_host(fresh, tmp_path / "a"), trial_host(fresh, tmp_path / "b")
    second_before = gpuhost_writes(second)
    inv = fleet_inventory(tmp_path / "fleet.py", [first, second], tmp_path / "store")

    run: Deploy = deploy(inv)
    assert run.rc == 0, run.output[-5000:]
    assert run.output.count(f"kernel {NEW} passed its trial boot") == 2, run.output[-5000:]
    for twin in (first, second):
        assert twin.run("uname -r")[1].strip() == NEW and pinned(twin) == NEW
    committed = (first.root / PIN).stat().st_mtime  # the first twin's commit pins NEW
    assert booted_at(first) < committed
    writes = [t for t in gpuhost_writes(second) if t not in second_before]
    assert writes, "the deploy wrote nothing on the second twin"
    assert committed < min(writes), "the second twin changed before the first committed"
    assert min(writes) < booted_at(second) < (second.root / PIN).stat().st_mtime

    again = deploy(inv)
    assert again.rc == 0 and not again.changed and again.reboots == 0, again.output[-3000:]


def test_a_failed_trial_stops_the_rollout_with_the_next_host_untouched(fresh, tmp_path):
    # The first twin's trial kernel panics (GSP firmware of another release, see
    # test_trial_deploy.py); the second is a host that would trial-boot fine.
    first = trial_host(fresh, tmp_path / "a", firmware="580.95.05")
    second = trial_host(fresh, tmp_path / "b")
    before, boot_id = manifest(second.root), second.boot_id()
    inv = fleet_inventory(tmp_path / "fleet.py", [first, second], tmp_path / "store")

    run = deploy(inv)
    assert run.rc != 0
    assert f"the host is back on {OLD}" in run.output, run.output[-5000:]
    assert f"not deployed: {first.name} failed earlier in this rollout" in run.output
    assert first.run("uname -r")[1].strip() == OLD and pinned(first) == OLD
    assert manifest(second.root) == before  # not a file changed: kernel, loader, modules
    assert second.boot_id() == boot_id and second.run("uname -r")[1].strip() == OLD
