"""What the deploys write, from facts: file contents computed locally, tested without a host."""

from dataclasses import replace

import pytest
from pyinfra.api.exceptions import DeployError

from deploys import boot_cmdline, modules, reboot
from deploys.context import Context
from facts.proxmox import parse_boot_tool_status
from gpuhost.plan import make_plan
from gpuhost.spec import HostSpec
from tests.unit.conftest import proxmox
from tests.unit.hosts import kpro6

SPEC = {"kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "580.95.05"}}


def context(files: dict[str, str], **spec: object) -> Context:
    host_spec = HostSpec.model_validate({**SPEC, **spec})
    facts = kpro6()
    return Context(
        spec=host_spec,
        facts=facts,
        files=files,
        boot_id="0" * 36,
        plan=make_plan("kpro6", host_spec, facts),
    )


def test_systemd_boot_cmdline_keeps_root_and_user_parameters() -> None:
    ctx = context({}, boot={"pci_realloc": True})
    current = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet intel_iommu=on mitigations=off\n"
    new = boot_cmdline.systemd_boot_cmdline(ctx, current)
    assert (
        new == "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet mitigations=off amd_iommu=on pci=realloc\n"
    )
    assert boot_cmdline.systemd_boot_cmdline(ctx, new) == new  # converged


def test_systemd_boot_without_cmdline_file_is_refused() -> None:
    with pytest.raises(DeployError, match="root= parameter"):
        boot_cmdline.systemd_boot_cmdline(context({}), None)


def test_grub_defaults_edit_only_the_cmdline_variables() -> None:
    ctx = context({}, boot={"acs_override": "downstream,multifunction"})
    current = (
        "GRUB_DEFAULT=0\n"
        "GRUB_TIMEOUT=5\n"
        'GRUB_DISTRIBUTOR="Proxmox VE"\n'
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=soft"\n'
        'GRUB_CMDLINE_LINUX="console=ttyS0 intel_iommu=on"\n'
    )
    new = boot_cmdline.grub_defaults(ctx, current)
    assert new.splitlines() == [
        "GRUB_DEFAULT=0",
        "GRUB_TIMEOUT=5",
        'GRUB_DISTRIBUTOR="Proxmox VE"',
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet amd_iommu=on pcie_acs_override=downstream,multifunction"',
        'GRUB_CMDLINE_LINUX="console=ttyS0"',
    ]
    assert boot_cmdline.grub_defaults(ctx, new) == new


def test_grub_without_default_variable_gets_one() -> None:
    new = boot_cmdline.grub_defaults(context({}), 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX=""\n')
    assert new.endswith('GRUB_CMDLINE_LINUX_DEFAULT="amd_iommu=on"\n')  # no iommu=pt: Blackwell


def test_module_files_follow_the_spec_and_converge_back() -> None:
    files = modules.wanted_files(context({}))
    assert files[modules.NVIDIA_OPTIONS].endswith("options nvidia_uvm uvm_disable_hmm=1\n")
    assert "blacklist nouveau\noptions nouveau modeset=0\n" in files[modules.BLACKLIST]
    assert files[modules.VFIO_LOAD] is None  # no GPU goes to a VM
    assert files[modules.NVIDIA_LOAD].endswith("nvidia\nnvidia_uvm\n")
    off = modules.wanted_files(
        context({}, modules={"uvm_disable_hmm": False, "blacklist_nouveau": False})
    )
    assert off[modules.NVIDIA_OPTIONS] is None and off[modules.BLACKLIST] is None
    vm = {"kind": "vm", "vmid": 129, "name": "vm129", "machine": "q35", "gpus": [7]}
    assert modules.wanted_files(context({}, guests=[vm]))[modules.VFIO_LOAD].endswith(
        "vfio\nvfio_iommu_type1\nvfio_pci\n"
    )


def test_reboot_reasons_are_the_ones_this_deploy_resolves() -> None:
    ctx = context({})
    found = reboot.reasons(ctx)
    assert "kernel command line changes: +amd_iommu=on" in found
    assert "nvidia_uvm uvm_disable_hmm is N, must be Y (module reload)" in found
    assert "module blacklist / boot-time modules changed (initramfs)" in found
    assert not any("kernel 6." in r or "NVIDIA driver" in r for r in found)
    converged = replace(
        ctx, files={modules.BLACKLIST: modules.wanted_files(ctx)[modules.BLACKLIST]}
    )
    assert "module blacklist / boot-time modules changed (initramfs)" not in reboot.reasons(
        converged
    )


def test_boot_loader_refresh_follows_proxmox_boot_tool() -> None:
    ctx = context({})  # kpro6: ESPs managed by proxmox-boot-tool (uefi)
    assert boot_cmdline.refresh_command(ctx) == "proxmox-boot-tool refresh"
    grub_esp = parse_boot_tool_status(proxmox("boot-tool-status-grub-esp.out"))
    assert grub_esp.loader == "grub"
    esp_ctx = replace(ctx, facts=replace(ctx.facts, boot_tool=grub_esp))
    assert boot_cmdline.refresh_command(esp_ctx) == "proxmox-boot-tool refresh"  # GRUB on ESPs
    plain = parse_boot_tool_status(proxmox("boot-tool-status-unconfigured.out"))
    assert (
        boot_cmdline.refresh_command(replace(ctx, facts=replace(ctx.facts, boot_tool=plain)))
        == "update-grub"
    )
    assert (
        boot_cmdline.refresh_command(replace(ctx, facts=replace(ctx.facts, boot_tool=None)))
        == "update-grub"
    )
