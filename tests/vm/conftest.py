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

from twin.vm import image, kernel, qemu
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
    (bookworm: Proxmox VE 8's base, trixie: 9's), booting the old kernel."""
    return lambda layout, suite="bookworm": image.base_image(
        suite, layout, [vm_kernels.old_debs.image]
    )


@pytest.fixture(scope="module")
def booted(
    vm_image: Callable[..., VmImage], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Vm]]:
    """booted(layout, suite="bookworm") -> a VM of that image, up and reachable over SSH;
    stopped after the module."""
    started: list[Vm] = []

    def start(layout: str, suite: str = "bookworm") -> Vm:
        vm = Vm.start(vm_image(layout, suite), tmp_path_factory.mktemp(f"vm-{suite}-{layout}"))
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


def deploy(vm: Vm, spec: dict, workdir: Path, timeout: float = 3000) -> Deploy:
    """The main deploy on ``vm``, from an inventory like a user's (host keys verified)."""
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
    run = subprocess.run(
        [str(PYINFRA), "-y", str(inventory), "deploys/gpu_host.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Deploy(run.returncode, run.stdout + run.stderr)


def sysctls(vm: Vm) -> dict[str, str]:
    names = "panic panic_on_oops softlockup_panic hardlockup_panic hung_task_panic"
    out = vm.ssh(f"cd /proc/sys/kernel && grep -H . {names}").stdout
    return dict(line.split(":", 1) for line in out.split())


PRODUCTION = {n: "0" for n in ("panic", "panic_on_oops", "softlockup_panic")} | {
    "hardlockup_panic": "0",
    "hung_task_panic": "0",
}
