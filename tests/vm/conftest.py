"""Fixtures of the vm tier: real Debian systems booted by OVMF in QEMU under TCG, with real
GRUB or systemd-boot, kernels, initramfs-tools and systemd (gpuhost-twin/twin/vm), which the
real deploy reaches over SSH through a loopback port forward.

What is real and what is not: the firmware, boot loaders, grubenv and EFI variables, kernels
(built from Debian's linux-source as -pve releases, twin/vm/kernel.py), initramfs-tools,
systemd, sshd and the deploy are; proxmox-boot-tool is gpuhost's stand-in of Proxmox's
(twin/vm/standin), and the VMs have no NVIDIA device, so the GPU checks do not apply there.

Images and kernels are built once per recipe and cached; each VM runs on its own qcow2
overlay, module-scoped so one boot serves a module's tests in order. A wait is always for a
console line or SSH, with a bound; a timeout shows the console's last lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuhost.control import read_control
from gpuhost.observe.hostfacts import parse_raw
from gpuhost.observe.live import gather_live
from gpuhost.plan.make import Plan, make_plan
from gpuhost.plan.model import PlanError
from gpuhost.spec.inventory import load_inventory
from twin.vm import boards, image, kernel, qemu
from twin.vm.image import VmImage
from twin.vm.qemu import BOOT_TIMEOUT, Vm

ROOT = Path(__file__).parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
DRIVER = "580.95.05"  # the spec needs one; no NVIDIA device, so no driver check applies


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the vm tier builds disk images on loop devices and chroots: run as root"
    lacking = qemu.missing() + kernel.missing()
    if lacking:
        return f"the vm tier needs {', '.join(lacking)} (tests/vm/APT_PACKAGES; ./gpuhost-setup)"
    return None


@pytest.fixture(scope="session")
def vm_kernels() -> kernel.VmKernels:
    """The two -pve kernels (built once per machine): ``old`` in the images, ``new`` to try."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    return kernel.vm_kernels()


@pytest.fixture(scope="session")
def vm_image(vm_kernels: kernel.VmKernels) -> Callable[..., VmImage]:
    """vm_image(layout, suite="bookworm") -> the cached image of that layout and Debian suite
    (bookworm: Proxmox VE 8's base, trixie: 9's), booting the old kernel; grub-sb boots
    Debian's signed kernel, with the old one beside it."""

    def of(layout: str, suite: str = "bookworm") -> VmImage:
        signed = image.debian_kernel(suite) if layout == "grub-sb" else []
        return image.base_image(suite, layout, [vm_kernels.old_debs.image, *signed])

    return of


@pytest.fixture(scope="module")
def booted(
    vm_image: Callable[..., VmImage], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Vm]]:
    """booted(layout, suite="bookworm", **Vm.start's options) -> a VM of that image, up and
    reachable over SSH; stopped after the module."""
    started: list[Vm] = []

    def start(layout: str, suite: str = "bookworm", **options: object) -> Vm:
        workdir = tmp_path_factory.mktemp(f"vm-{suite}-{layout}")
        vm = Vm.start(vm_image(layout, suite), workdir, **options)  # type: ignore[arg-type]
        started.append(vm)
        vm.wait_ssh(BOOT_TIMEOUT)
        return vm

    start.started = started  # type: ignore[attr-defined]  # for pytest_runtest_makereport
    yield start
    for vm in started:
        vm.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed vm test shows its VMs' last console lines: what the firmware, the loader and
    the kernel did is often the only account of a boot that never came back over SSH."""
    report = yield
    booted = getattr(item, "funcargs", {}).get("booted")
    if report.failed and booted is not None:
        for vm in booted.started:
            report.sections.append((f"console of {vm.workdir.name}", vm.tail(80)))
    return report


@dataclass
class Deploy:
    rc: int
    output: str

    @property
    def changed(self) -> bool:
        """pyinfra's results table: any operation with a count in its Success column."""
        table = self.output.split("--> Results:", 1)[1]
        rows = [line.split() for line in table.splitlines() if " | " in line]
        assert rows, self.output
        return any(row[-3] != "-" for row in rows)  # columns: Hosts Success Error No-Change


def vm_spec(release: str, extra: list[str] | None = None, **trial: object) -> dict:
    """A host spec for a VM: its kernel, IOMMU parameters and ``extra`` ones; no GPU guests."""
    return {
        "kernel": {"version": release, **({"trial": trial} if trial else {})},
        "driver": {"version": DRIVER},
        "modules": {"uvm_disable_hmm": False},  # no container: no HMM question
        "boot": {"extra": ["pcie_aspm=off", *(extra or [])]},
    }


REBOOT_TIMEOUT = 1800


def inventory_file(vm: Vm, spec: dict, workdir: Path) -> Path:
    """An inventory like a user's for ``vm`` (host 'vm', host keys verified)."""
    workdir.mkdir(parents=True, exist_ok=True)
    inventory = workdir / "inventory.py"
    # Under TCG on two shared cores beside the other tiers, a reboot's firmware phase was seen
    # to take from seconds to 12 minutes (CI, Dec 2026): the bound is generous, as a slow
    # server's would be, and the console shows where the time went.
    data = {**vm.host_data, "gpuhost_reboot_delay": 5, "gpuhost_reboot_timeout": REBOOT_TIMEOUT}
    inventory.write_text(
        "from gpuhost.spec.inventory import gpu_host\n"
        f"hosts = [gpu_host('vm', {spec!r}, **{data!r})]\n"
    )
    return inventory


def plan_of(vm: Vm, spec: dict, workdir: Path) -> Plan:
    """The Plan ``gpuhost plan`` makes for ``vm`` from its live facts (gpuhost/cli.py)."""
    inventory = inventory_file(vm, spec, workdir)
    ((host_spec, _),) = load_inventory(str(inventory)).values()
    facts = parse_raw(gather_live(str(inventory))["vm"])
    control = read_control(host_spec, facts, str(inventory))
    return make_plan("vm", host_spec, facts, str(inventory), control)


def deploy(vm: Vm, spec: dict, workdir: Path, timeout: float = 3000) -> Deploy:
    """The main deploy on ``vm``, from an inventory like a user's (host keys verified)."""
    inventory = inventory_file(vm, spec, workdir)
    run = subprocess.run(
        [str(PYINFRA), "-y", str(inventory), "deploys/gpu_host.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Deploy(run.returncode, run.stdout + run.stderr)


def failed_trial(vm: Vm, spec: dict, workdir: Path, *on_console: str) -> list[str]:
    """Deploy ``spec``, whose trial must fail and come back: the deploy reports the host back
    on its old boot, and the console shows GRUB booting the trial entry, then each pattern of
    ``on_console`` in order, then GRUB again. Returns the command line the kernel after that
    booted with."""
    start = vm.console_offset()
    done = deploy(vm, spec, workdir)
    assert done.rc != 0 and "the host is back on" in done.output, done.output[-3000:]
    vm.wait_console(r"Loading Linux \S+ \(gpuhost trial\)", 10, since=start)
    for pattern in on_console:
        vm.wait_console(pattern, 10)
    vm.wait_console(r"GNU GRUB", 10)
    line = vm.wait_console(r"Command line: (.*)", 10).group(1).split()
    assert "gpuhost.trial=1" not in line
    return line


def plain_reboot(vm: Vm, planned: tuple[str, ...], loader: str | None = "GNU GRUB") -> list[str]:
    """Reboot with no one-shot set (through ``loader``'s menu, seen on the console): the line
    booted carries ``planned`` and not the trial's mark, and the panic settings are
    production's. Returns that command line."""
    start = vm.reboot(BOOT_TIMEOUT)
    if loader:
        vm.wait_console(loader, 10, since=start)
    cmdline = vm.ssh("cat /proc/cmdline").stdout.split()
    assert all(p in cmdline for p in planned) and "gpuhost.trial=1" not in cmdline
    assert sysctls(vm) == PRODUCTION
    return cmdline


# What a refused run must leave as it was: the loaders' files, kernels, initrds, grubenv, module
# options and loads.
BOOT_FILES = "/boot /etc/default /etc/kernel /etc/modprobe.d /etc/modules-load.d /etc/grub.d"


def boot_files_digest(vm: Vm) -> str:
    return vm.ssh(f"find {BOOT_FILES} -type f -print0 | sort -z | xargs -0 sha256sum").stdout


def sysctls(vm: Vm) -> dict[str, str]:
    names = "panic panic_on_oops softlockup_panic hardlockup_panic hung_task_panic"
    out = vm.ssh(f"cd /proc/sys/kernel && grep -H . {names}").stdout
    return dict(line.split(":", 1) for line in out.split())


PRODUCTION = {n: "0" for n in ("panic", "panic_on_oops", "softlockup_panic")} | {
    "hardlockup_panic": "0",
    "hung_task_panic": "0",
}


# -- GPU boards (twin/vm/boards.py) -------------------------------------------------------------


def stand_in_gpus(vm: Vm) -> dict[str, str]:
    """Give the boards' GPUs their identity (once per boot); returns them by name (A, B, C, D):
    BDF. C and D are the two behind the PCIe-to-PCI bridge, in bus order."""
    placed = dict(line.split() for line in vm.ssh(boards.identity_command()).stdout.splitlines())
    port = {bdf: name for name, bdf in boards.PORTS.items()}
    under = {name: [b for b, p in sorted(placed.items()) if port.get(p) == name] for name in "AB"}
    behind_bridge = sorted(b for b, p in placed.items() if p not in port)
    assert len(under["A"]) == len(under["B"]) == 1 and len(behind_bridge) == 2, placed
    return {"A": under["A"][0], "B": under["B"][0], "C": behind_bridge[0], "D": behind_bridge[1]}


def usb_c(gpu: str) -> str:
    """The USB-C function of a board (function 1 of the GPU's slot)."""
    return gpu[:-1] + "1"


def guests_spec(release: str, owners: dict[int, list[str]]) -> dict:
    """The vm tier's spec with a q35 VM per vmid in owners, taking those GPUs (the VMs need no
    config on the host for the plan: their machine type is given)."""
    vms = [
        {"kind": "vm", "vmid": vmid, "name": f"vm{vmid}", "machine": "q35", "gpus": gpus}
        for vmid, gpus in owners.items()
    ]
    return vm_spec(release) | {"guests": vms}


def group_of(vm: Vm, bdf: str) -> int:
    """The IOMMU group the guest's kernel put bdf in."""
    return int(vm.ssh(f"basename $(readlink /sys/bus/pci/devices/{bdf}/iommu_group)").stdout)


def assert_groups_read_and_judged(vm: Vm, release: str, workdir: Path) -> None:
    """The topology's groups are what the kernel made, gpuhost's plan reads the same, takes a
    board whole to a VM, and refuses a split that cuts the bridge's group."""
    gpus = stand_in_gpus(vm)
    groups = {name: group_of(vm, bdf) for name, bdf in gpus.items()}
    assert group_of(vm, usb_c(gpus["A"])) == groups["A"]  # one board, one group
    assert groups["C"] == groups["D"]  # behind one conventional bridge
    assert len({groups["A"], groups["B"], groups["C"], group_of(vm, boards.HOST_XHCI)}) == 4
    whole = plan_of(vm, guests_spec(release, {100: [gpus["A"]]}), workdir / "whole")  # accepted
    assert {g.bdf: g.iommu_group for g in whole.gpus} == {gpus[n]: groups[n] for n in gpus}
    assert whole.vm_functions == {100: (gpus["A"], usb_c(gpus["A"]))}
    with pytest.raises(PlanError) as refused:
        plan_of(vm, guests_spec(release, {100: [gpus["C"]], 101: [gpus["D"]]}), workdir / "cut")
    said = [p for p in refused.value.problems if f"IOMMU group {groups['C']} is split" in p]
    assert said and gpus["C"] in said[0] and gpus["D"] in said[0], refused.value.problems
