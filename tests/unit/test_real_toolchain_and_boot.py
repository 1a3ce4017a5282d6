"""The one-toolchain rule and the boot path on real captured output: the 1x H200 machine
(tests/fixtures/captures/h200x1/facts, 2026-12-01 14:41 UTC). Its kernel was built by
`gcc (GCC) 15.3.0` and its config is only in /proc/config.gz; the compilers installed there are
Ubuntu's gcc 12 and 13, so a module build for that kernel must be refused, naming both."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuhost.observe.boot import BootPath
from gpuhost.observe.compilers import KernelCompilers
from gpuhost.plan.driver.toolchain import choose_module_compiler
from tests.unit.conftest import captured

KERNEL = "6.18.44-fc-v973-gpu"


def test_kernel_compiler_read_from_proc_config_gz() -> None:
    inventory = KernelCompilers().process(captured("h200x1", "KernelCompilers"))
    assert list(inventory.kernels) == [KERNEL] and list(inventory.kernels[KERNEL]) == ["proc"]
    assert inventory.kernel_compiler(KERNEL) == "gcc (GCC) 15.3.0"
    assert inventory.compilers["gcc-12"] == "gcc-12 (Ubuntu 12.4.0-2ubuntu1~24.04.1) 12.4.0"
    assert set(inventory.compilers) == {"gcc", "cc", "gcc-12", "gcc-13"}


def test_no_installed_compiler_may_build_modules_for_that_kernel() -> None:
    inventory = KernelCompilers().process(captured("h200x1", "KernelCompilers"))
    kernel_cc = inventory.kernel_compiler(KERNEL)
    assert kernel_cc is not None
    choice = choose_module_compiler(kernel_cc, inventory.compilers)
    assert choice.command is None and choice.refusal is not None
    assert "gcc (GCC) 15.3.0" in choice.refusal and "12.4.0" in choice.refusal


def test_boot_path_of_a_bios_vm_without_proxmox() -> None:
    path = BootPath().process(captured("h200x1", "BootPath"))
    assert path.known and not path.uefi and not path.systemd_boot_started
    assert path.esp_uuids is None and path.grubenv is None
    assert (path.boot_free, path.boot_size) == (68677652480, 270553174016)  # as recaptured
    assert path.bootctl is False  # a bare machine: no systemd-boot package (recaptured 12-03)


def test_release_of_a_machine_without_proxmox() -> None:
    """HostRelease on the H200 machine (recaptured 2026-12-03 19:08 UTC): Ubuntu 24.04's
    os-release, no pve-manager, so no Proxmox release to plan an upgrade from."""
    from gpuhost.observe.release import HostReleaseFact

    release = HostReleaseFact().process(captured("h200x1", "HostRelease"))
    assert (release.distribution, release.debian, release.codename) == ("ubuntu", "24.04", "noble")
    assert release.pve_manager is None and release.pve_major is None


@pytest.mark.parametrize("key", ["KernelCompilers", "BootPath", "HostRelease"])
def test_the_capture_ran_cleanly(key: str) -> None:
    rc = Path(__file__).parents[1] / f"fixtures/captures/h200x1/facts/{key}.rc"
    assert rc.read_text().strip() == "0"
