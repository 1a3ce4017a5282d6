"""The audit on a deployed kpro6 twin with its guests: it passes, and each planted defect fails
with exactly its own finding.

The twin is deployed with the real pyinfra CLI; the GPU split itself (VM GPUs on vfio-pci by
BDF, the container and VM configs, the container's NVIDIA userspace) is put in place by this
test the way an operator does today, until the deploy applies it too. Defects are planted in
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

from gpuhost.audit.plugin import Target, _runner, _testinfra_host
from gpuhost.audit.run import audit_all, read_host
from gpuhost.spec.inventory import load_inventory
from tests.e2e.conftest import ROOT, Deploy, deploy, inventory, with_driver
from twin import driver as twin_driver
from twin import node, userspace
from twin.hwtesting import ModuleCache
from twin.nvinstaller import build_installer
from twin.pytest_plugin import PVE_DIRS, TwinHandle

VERSION = "595.71.05"
MODEL = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
SPEC = load_inventory(ROOT / "inventory/kpro6.py")["kpro6"][0].model_dump(mode="json")
SPEC["hardware"] = {"gpus": 8, "gpu_model": MODEL}
# ct200's guest software (CUDA toolkits) is tests/e2e/test_guest_software.py's: this twin is not
# given it, so its container asks for none here (the software checks then do not apply).
for _guest in SPEC["guests"]:
    if _guest["kind"] == "lxc":
        _guest["cuda"] = []
CT_GPUS = (
    "0000:01:00.0",
    "0000:21:00.0",
    "0000:41:00.0",
    "0000:61:00.0",
    "0000:81:00.0",
    "0000:a1:00.0",
)
VM_FUNCTIONS = ("0000:c1:00.0", "0000:c1:00.1", "0000:e1:00.0", "0000:e1:00.1")
CT_NODES = [f"/dev/nvidia{i}" for i in range(6)] + [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
]


def ct_config(hostname: str, nodes: list[str]) -> str:
    """An unprivileged container granted exactly ``nodes`` with devN entries."""
    devs = "".join(f"dev{i}: {path}\n" for i, path in enumerate(nodes))
    return f"arch: amd64\nhostname: {hostname}\nostype: debian\nunprivileged: 1\n{devs}"


CT200 = ct_config("ct200", CT_NODES)
HOOK = "hookscript: local:snippets/gpuhost-ready\n"  # what give_readiness sets (readiness.md)
VM129 = "machine: q35\nname: vm129\nhostpci0: 0000:c1:00,pcie=1\nhostpci1: 0000:e1:00,pcie=1\n"
# VM GPUs go to vfio-pci by PCI address at device add (the GPU split deploy will own this).
UDEV = "".join(
    f'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="{bdf}", ATTR{{driver_override}}="vfio-pci"\n'
    for bdf in VM_FUNCTIONS
)
SIZES = (4096, 1 << 20)


def put(twin: TwinHandle, path: str, text: str) -> None:
    rc, _, err = twin.run(f"mkdir -p $(dirname {path}) && cat > {path} <<'EOF'\n{text}EOF")
    assert rc == 0, err


def ct(twin: TwinHandle, op: str) -> None:
    rc, _, err = twin.run(f"pct {op} 200")
    assert rc == 0, err


def provision(twin: TwinHandle, modules: ModuleCache, inv: Path) -> Path:
    """A kpro6 twin as deployed, with its GPU split and guests in place (benchmarks use it too)."""
    deploy_host(twin, modules, inv, SPEC)
    place_guests(twin)
    give_readiness(twin, inv)
    return inv


def deploy_host(twin: TwinHandle, modules: ModuleCache, inv: Path, spec: dict) -> Deploy:
    """The driver installed, then the main deploy run once (tests/e2e/test_pve9.py too)."""
    with_driver(twin, modules, VERSION)
    userspace.install_root(twin.root, VERSION)
    inventory(inv, twin, spec)
    result = deploy(inv)
    assert result.rc == 0, result.output[-3000:]
    return result


def place_guests(twin: TwinHandle) -> None:
    """The GPU split as an operator puts it in place today: VM boards on vfio-pci, the
    container's and the VM's configs, the container started with the driver's userspace."""
    twin.run(PVE_DIRS)
    put(twin, "/etc/udev/rules.d/70-gpuhost-vfio.rules", UDEV)
    put(twin, "/etc/pve/lxc/200.conf", CT200)
    put(twin, "/etc/pve/qemu-server/129.conf", VM129)
    twin.reboot()  # binds the VM's boards to vfio-pci
    ct(twin, "start")
    twin_driver.install_userspace(node.Twin.load(twin.name), 200, VERSION)


def give_readiness(twin: TwinHandle, inv: Path) -> None:
    """What the deploy gives guests placed after it ran (a run now would also replace their
    hand-made entries): gpuhost's hookscript and each guest's contract, from the host's Plan
    (gpuhost/plan/guests/readiness.py, docs/guides/readiness.md)."""
    name, (spec, data) = next(iter(load_inventory(inv).items()))
    target = Target(name, spec, data, f"ssh://root@{twin.address}:22", str(inv))
    plan = read_host(name, spec, _runner(_testinfra_host(target)), None, SIZES, guests=False)
    assert plan.context is not None, plan.refused
    readiness = plan.context.plan.readiness
    if readiness.snippets_content:
        assert twin.run(f"pvesm set local --content {readiness.snippets_content}")[0] == 0
    for item in plan.context.plan.files.values():
        if item.concern == "readiness" and item.content is not None:
            put(twin, item.path, item.content)
            assert twin.run(f"chmod {item.mode} {item.path}")[0] == 0
    for hook in readiness.hooks.values():
        rc, _, err = twin.run(f"{hook.tool} set {hook.vmid} --hookscript {hook.wanted}")
        assert rc == 0, err


@pytest.fixture(scope="module")
def kpro6(twin_fleet, modules, tmp_path_factory) -> Iterator[tuple[TwinHandle, Path]]:
    (twin,) = twin_fleet.start(1, "kpro6")
    try:
        yield twin, provision(twin, modules, tmp_path_factory.mktemp("audit") / "kpro6.py")
    finally:
        twin_fleet.stop(twin)


def audit(twin: TwinHandle, inv: Path, field: str = "found") -> dict[str, list[str]]:
    """check id (with /guest) -> each finding's ``field`` (found, fix...), for every failed check."""
    name, (spec, data) = next(iter(load_inventory(inv).items()))
    target = Target(name, spec, data, f"ssh://root@{twin.address}:22", str(inv))
    host = read_host(name, spec, _runner(_testinfra_host(target)), None, SIZES)
    failed = {}
    for outcome in audit_all(host):
        if outcome.status == "failed":
            key = outcome.check.id + (
                "/" + outcome.target.split("/", 1)[1] if "/" in outcome.target else ""
            )
            failed[key] = [getattr(f, field) for f in outcome.findings]
    return failed


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
