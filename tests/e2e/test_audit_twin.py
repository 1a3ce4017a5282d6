"""The audit on a deployed kpro6 twin with its guests: it passes, and each planted defect fails
with exactly its own finding.

The twin is deployed with the real pyinfra CLI; the GPU split itself (VM GPUs on vfio-pci by
BDF, the container and VM configs, the container's NVIDIA userspace) is put in place the way an
operator does today (tests/e2e/guests.py), until the deploy applies it too. Defects are planted in
the simulated hardware or in the host's files, audited over real SSH (testinfra) and through
`pct exec` into the real LXC container, then undone.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, inventory
from tests.e2e.guests import CT200, HOOK, SPEC, VERSION, audit, ct, provision, put
from twin import driver as twin_driver
from twin import node, userspace
from twin.nvinstaller import build_installer
from twin.pytest_plugin import TwinHandle


@pytest.fixture(scope="module")
def kpro6(twin_fleet, modules, tmp_path_factory) -> Iterator[tuple[TwinHandle, Path]]:
    (twin,) = twin_fleet.start(1, "kpro6")
    try:
        yield twin, provision(twin, modules, tmp_path_factory.mktemp("audit") / "kpro6.py")
    finally:
        twin_fleet.stop(twin)


def test_a_deployed_kpro6_with_its_guests_passes(kpro6):
    twin, inv = kpro6
    failed = audit(twin, inv)
    assert failed == {}, json.dumps(failed, indent=1)


def test_gpuhost_audit_writes_json_and_junit_reports(kpro6, tmp_path):
    twin, inv = kpro6
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuhost.cli",
            "audit",
            str(inv),
            "--json",
            str(tmp_path / "a.json"),
            "--junit",
            str(tmp_path / "a.xml"),
            "--p2p-sizes",
            "4096",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    report = json.loads((tmp_path / "a.json").read_text())
    assert report["summary"]["failed"] == 0
    assert report["hosts"][twin.name]["remote_commands"] == 2  # the host, and ct200 via pct exec
    assert report["hosts"][twin.name]["guests"] == {"ct200": f"pct exec 200 on {twin.name}"}
    by_check = {r["check"] + "@" + r["target"]: r for r in report["results"]}
    assert by_check[f"ct.cuda@{twin.name}/ct200"]["status"] == "passed"
    assert by_check[f"driver.fabricmanager@{twin.name}"]["skipped"] == "no NVSwitch on the PCI bus"
    copies = by_check[f"ct.p2p@{twin.name}/ct200"]["details"]["copies"]
    assert len(copies) == 6 + 30  # each GPU with itself, and every ordered pair
    assert "testcase" in (tmp_path / "a.xml").read_text()


def test_a_container_with_its_own_ssh_is_read_over_it(kpro6, tmp_path):
    twin, _ = kpro6
    spec = copy.deepcopy(SPEC)
    (ct200,) = [g for g in spec["guests"] if g["name"] == "ct200"]
    ct200["access"] = {"ssh_hostname": twin.guest(200).address}
    inv = inventory(tmp_path / "own-ssh.py", twin, spec)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuhost.cli",
            "audit",
            str(inv),
            "--json",
            str(tmp_path / "a.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    host = json.loads((tmp_path / "a.json").read_text())["hosts"][twin.name]
    assert host["guests"] == {"ct200": f"ssh root@{twin.guest(200).address}"}
    assert host["remote_commands"] == 2
    # `gpuhost metrics` on the same inventory: ct200 read over its own SSH too (the shared runner)
    done = subprocess.run(
        [sys.executable, "-m", "gpuhost.cli", "metrics", str(inv), "--p2p-sizes", "4096"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cuda = f'gpuhost_check_ok{{host="{twin.name}",guest="ct200",check="ct.cuda"}} 1'
    assert cuda in done.stdout.splitlines(), done.stdout[-3000:]


def _planted(
    kpro6, plant: Callable[[TwinHandle], None], undo: Callable[[TwinHandle], None]
) -> dict[str, list[str]]:
    twin, inv = kpro6
    plant(twin)
    try:
        return audit(twin, inv)
    finally:
        undo(twin)
        assert audit(twin, inv) == {}, "the defect was not undone"


def _sh(command: str) -> Callable[[TwinHandle], None]:
    def run(twin: TwinHandle) -> None:
        rc, _, err = twin.run(command)
        assert rc == 0, err

    return run


def _edit_root(rel: str, old: str, new: str) -> Callable[[TwinHandle], None]:
    """Edit a file of the simulated kernel's state (/proc, /sys) from outside the twin."""

    def run(twin: TwinHandle) -> None:
        path = twin.root / rel
        text = path.read_text()
        assert old in text, text
        path.write_text(text.replace(old, new))

    return run


def test_stale_uvm_major_in_raw_rules(kpro6):
    twin, _ = kpro6
    devices = twin.run("cat /proc/devices")[1].split("\n\n")[0].splitlines()[1:]
    live = {int(line.split()[0]) for line in devices}
    uvm = int(next(line.split()[0] for line in devices if line.split()[1] == "nvidia-uvm"))
    stale = next(m for m in range(uvm + 1, 4096) if m not in live)  # a major nothing has now
    raw = (
        "arch: amd64\nhostname: ct200\nunprivileged: 1\n"
        "lxc.cgroup2.devices.allow: c 195:0 rwm\nlxc.cgroup2.devices.allow: c 195:255 rwm\n"
        f"lxc.cgroup2.devices.allow: c {stale}:* rwm\n{HOOK}"
        + "".join(f"dev{i}: /dev/nvidia{i}\n" for i in range(1, 6))
        + "".join(
            f"lxc.mount.entry: {p} {p[1:]} none bind,optional,create=file\n"
            for p in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
        )
    )

    def plant(t: TwinHandle) -> None:
        ct(t, "stop")
        put(t, "/etc/pve/lxc/200.conf", raw)
        ct(t, "start")

    def undo(t: TwinHandle) -> None:
        ct(t, "stop")
        put(t, "/etc/pve/lxc/200.conf", CT200 + HOOK)
        ct(t, "start")

    failed = _planted(kpro6, plant, undo)
    assert set(failed) == {"ct.device_rules/ct200", "ct.cuda/ct200"}
    assert any("stale" in f for f in failed["ct.device_rules/ct200"])
    assert failed["ct.cuda/ct200"] == ["CUDA_ERROR_UNKNOWN"]


def test_guest_driver_mismatch(kpro6):
    def plant(t: TwinHandle) -> None:
        twin_driver.install_userspace(node.Twin.load(t.name), 200, "580.95.05")

    def undo(t: TwinHandle) -> None:
        twin_driver.install_userspace(node.Twin.load(t.name), 200, VERSION)

    failed = _planted(kpro6, plant, undo)
    assert set(failed) == {"ct.userspace/ct200", "ct.cuda/ct200"}
    assert failed["ct.cuda/ct200"] == ["CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"]


def test_module_built_by_another_compiler(kpro6):
    gcc = "gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)"
    other = "gcc version 13.2.0 (Debian 13.2.0-25)"
    failed = _planted(
        kpro6,
        _edit_root("proc/driver/nvidia/version", gcc, other),
        _edit_root("proc/driver/nvidia/version", other, gcc),
    )
    assert failed == {"driver.compiler": ["GCC 13.2.0 (/proc/driver/nvidia/version)"]}


def test_wrong_gsp_firmware_on_one_gpu(kpro6):
    info = "proc/driver/nvidia/gpus/0000:41:00.0/information"
    failed = _planted(
        kpro6,
        _edit_root(info, f"GPU Firmware: \t {VERSION}", "GPU Firmware: \t 580.95.05"),
        _edit_root(info, "GPU Firmware: \t 580.95.05", f"GPU Firmware: \t {VERSION}"),
    )
    assert failed == {"driver.firmware": ["GPU Firmware 580.95.05"]}


def test_missing_gsp_firmware_files(kpro6):
    d = f"/lib/firmware/nvidia/{VERSION}"
    failed = _planted(kpro6, _sh(f"mv {d} /root/fw-aside"), _sh(f"mv /root/fw-aside {d}"))
    assert failed == {"driver.next_boot": ["missing"]}


def test_wrong_binding(kpro6):
    link = "sys/bus/pci/devices/0000:e1:00.1/driver"

    def plant(t: TwinHandle) -> None:
        path = t.root / link
        assert path.is_symlink()
        path.unlink()
        path.symlink_to("../../../../bus/pci/drivers/snd_hda_intel")

    def undo(t: TwinHandle) -> None:
        path = t.root / link
        path.unlink()
        path.symlink_to("../../../../bus/pci/drivers/vfio-pci")

    failed = _planted(kpro6, plant, undo)
    assert failed == {"gpus.binding": ["bound to snd_hda_intel"]}


def test_cmdline_without_the_iommu_parameter(kpro6):
    failed = _planted(
        kpro6,
        _edit_root("proc/cmdline", " iommu=pt", ""),
        _edit_root("proc/cmdline", " pci=realloc", " iommu=pt pci=realloc"),
    )
    assert failed == {"boot.cmdline": ["missing"]}


def test_hmm_not_disabled(kpro6):
    # Loaded by hand without the option (a command-line value wins over modprobe.d).
    reload = "modprobe -r nvidia_uvm && modprobe nvidia_uvm"
    failed = _planted(kpro6, _sh(f"{reload} uvm_disable_hmm=0"), _sh(reload))
    assert set(failed) == {"modules.parameters", "ct.cuda/ct200"}
    assert failed["modules.parameters"] == ["N"]
    assert failed["ct.cuda/ct200"] == ["CUDA_ERROR_UNKNOWN"]


def test_missing_device_node(kpro6):
    # The audit reads the nodes before its CUDA probe runs, which (like the real libcuda, through
    # nvidia-modprobe) makes the missing node again.
    failed = _planted(kpro6, _sh("rm /dev/nvidia3"), _sh("test -c /dev/nvidia3"))
    assert failed == {"devices.nodes": ["missing"]}


def test_boot_unit_not_enabled(kpro6):
    wants = "/etc/systemd/system/multi-user.target.wants/gpuhost-nvidia-devices.service"
    failed = _planted(
        kpro6,
        _sh(f"rm {wants}"),
        _sh(f"ln -s /etc/systemd/system/gpuhost-nvidia-devices.service {wants}"),
    )
    assert failed == {"devices.boot_unit": ["missing"]}


def test_blanket_device_rule(kpro6):
    conf = "/etc/pve/lxc/200.conf"
    failed = _planted(
        kpro6,
        _sh(f"echo 'lxc.cgroup2.devices.allow: a' >> {conf}"),
        _sh(f"sed -i '/devices.allow: a$/d' {conf}"),
    )
    assert failed == {"ct.device_rules/ct200": ["a blanket rule: every device of the host"]}


def test_cgroup_v1_rule_on_a_cgroup2_host(kpro6):
    """A rule from an old guide (`lxc.cgroup.devices.allow`) grants nothing on kpro6's pure
    cgroup2 layout (LXC ignores v1 limits there); the audit says so instead of counting it."""
    conf = "/etc/pve/lxc/200.conf"
    failed = _planted(
        kpro6,
        _sh(f"echo 'lxc.cgroup.devices.allow: c 195:* rwm' >> {conf}"),
        _sh(f"sed -i '/^lxc.cgroup.devices.allow: c 195/d' {conf}"),
    )
    assert failed == {
        "ct.device_rules/ct200": ["a cgroup v1 rule, which LXC ignores on this pure cgroup2 host"]
    }


def test_next_boot_kernel_without_modules(kpro6):
    from twin.hardware import add_kernel
    from twin.profile import Kernel

    new = "6.17.2-1-pve"

    running = kpro6[0].run("uname -r")[1].strip()

    def plant(t: TwinHandle) -> None:
        # an apt upgrade's newer kernel, and no pin: the trial boot left the running kernel
        # pinned, which is what keeps a kernel like this from booting
        add_kernel(
            t.root, Kernel(version=new, gcc="gcc (Debian 12.2.0-14+deb12u1) 12.2.0"), headers=False
        )
        assert t.run("proxmox-boot-tool kernel unpin && proxmox-boot-tool refresh")[0] == 0

    def undo(t: TwinHandle) -> None:
        t.run(
            f"rm -rf /boot/vmlinuz-{new} /boot/initrd.img-{new} /boot/config-{new} /lib/modules/{new}"
        )
        t.run(f"proxmox-boot-tool kernel pin {running} && proxmox-boot-tool refresh")

    failed = _planted(kpro6, plant, undo)
    assert failed == {"driver.next_boot": ["no module", "no module"]}


def test_a_container_without_the_userspace_is_fixed_by_the_advice(kpro6):
    """kpro6's spec has no driver.source.installer: the deploy leaves ct200's userspace alone, so
    re-running it is no fix. The advice names the install; doing exactly that passes the audit."""
    twin, inv = kpro6
    libs = f"/{userspace.LIBDIR}/libcuda.so* /{userspace.LIBDIR}/libnvidia-ml.so*"
    _sh(f"pct exec 200 -- sh -c 'rm -f {libs} && ldconfig'")(twin)
    try:
        failed = audit(twin, inv, "fix")
        assert set(failed) == {"ct.userspace/ct200", "ct.cuda/ct200"}, failed
        (fix,) = failed["ct.cuda/ct200"]
        assert failed["ct.userspace/ct200"] == [fix.partition(": ")[2]]
        assert not fix.partition(": ")[2].startswith("re-run the deploy"), fix
        command = fix.split("`")[1]  # the install the advice names, run as it says on the host
        build_installer(VERSION, twin.root / "root")
        _sh(f"cd /root && {command}")(twin)
        assert audit(twin, inv) == {}
    finally:
        twin_driver.install_userspace(node.Twin.load(twin.name), 200, VERSION)


def test_panic_settings_left_on_by_a_trial(kpro6):
    """A trial boot runs with panic_on_oops and friends on; a host left that way fails."""
    failed = _planted(
        kpro6,
        _sh("echo 1 > /proc/sys/kernel/panic_on_oops; echo 1 > /proc/sys/kernel/hung_task_panic"),
        _sh("echo 0 > /proc/sys/kernel/panic_on_oops; echo 0 > /proc/sys/kernel/hung_task_panic"),
    )
    assert failed == {"boot.panic": ["1", "1"]}
