"""Inventory values as Proxmox and the kernel take them: q35 for VMs with GPUs (one rule for
the spec, the split and the audit), guest names with upper case, a user's own pci= options."""

from __future__ import annotations

import pytest

from gpuhost.plan.boot.iommu import plan_iommu
from gpuhost.spec.grammar import machine_is_q35
from gpuhost.spec.validate import SpecError, validate_spec

BASE = {"kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "580.95.05"}}


def spec(**changes: object):
    return validate_spec("inventory/x.py", "kpro6", {**BASE, **changes})


@pytest.mark.parametrize(
    ("machine", "q35"),
    [
        ("q35", True),
        ("pc-q35-8.1", True),
        ("pc-q35-10.0+pve1", True),
        ("type=q35,viommu=virtio", True),  # qemu-server's `[type=]<type>[,viommu=..]` form
        ("q35,viommu=intel", True),
        (None, False),  # no machine key: qemu-server's default, i440fx
        ("", False),
        ("pc", False),
        ("pc-i440fx-8.1", False),
        ("pc-i440fx-8.1+pve0", False),
        ("type=pc-i440fx-8.1,viommu=virtio", False),
        ("viommu=intel", False),  # options without a type: the default type
    ],
)
def test_q35_is_qemu_servers_rule(machine: str | None, q35: bool) -> None:
    assert machine_is_q35(machine) is q35


def test_a_vm_taking_the_rest_of_the_gpus_on_i440fx_is_refused() -> None:
    vm = {"kind": "vm", "vmid": 129, "name": "vm129", "machine": "pc-i440fx-8.1", "gpus": "rest"}
    with pytest.raises(SpecError) as info:
        spec(guests=[vm])
    (problem,) = info.value.problems
    assert problem.startswith("guests[0].machine = 'pc-i440fx-8.1'")
    assert "set machine: q35 for it in the inventory" in problem
    assert spec(guests=[{**vm, "machine": "pc-q35-8.1"}]).vm_guests[0].gpus == "rest"


@pytest.mark.parametrize("name", ["CT200", "GPU-Box.lab", "Ct-200"])
def test_guest_names_take_upper_case_as_proxmox_does(name: str) -> None:
    # pve-common JSONSchema.pm pve_verify_dns_name: labels of [a-zA-Z0-9] and inner '-'
    guests = [{"kind": "lxc", "ctid": 200, "name": name}]
    assert spec(guests=guests).guests[0].name == name


@pytest.mark.parametrize("name", ["-ct200", "ct_200", "ct200.", "a..b"])
def test_guest_names_outside_proxmoxs_dns_name_are_refused(name: str) -> None:
    with pytest.raises(SpecError, match=r"guests\[0\]\.name"):
        spec(guests=[{"kind": "lxc", "ctid": 200, "name": name}])


def test_a_users_other_pci_options_are_theirs() -> None:
    boot = spec(boot={"extra": ["pci=noaer"], "pci_realloc": True}).boot
    assert boot.extra == ["pci=noaer"]
    planned = plan_iommu(
        cpu_vendor="amd",
        snp_host=False,
        iommu=True,
        iommu_passthrough=None,
        snp="keep",
        acs_override=None,
        pci_realloc=True,
        extra=boot.extra,
        configured=[("pci=nomsi", "/etc/kernel/cmdline"), ("pci=realloc", "/etc/kernel/cmdline")],
        running=[],
        iommu_active=True,
    )
    # the user's pci=realloc already gives gpuhost's; pci=noaer is added beside pci=nomsi
    assert planned.refusals == () and planned.wanted == ("iommu=pt", "pci=noaer")
