from pathlib import Path

import pytest

from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import gpu_host, load_inventory
from gpuhost.spec.validate import SpecError, validate_spec

BASE = {"kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "580.159.04"}}
ROOT = Path(__file__).parents[2]


def spec(**changes: object) -> dict:
    return {**BASE, **changes}


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        validate_spec("inventory/x.py", "kpro6", data)
    assert str(info.value).startswith("inventory/x.py: host 'kpro6': invalid gpuhost spec")
    return info.value.problems


def test_defaults() -> None:
    host = HostSpec.model_validate(BASE)
    assert host.toolchain.gcc == "12.2.0"
    assert host.driver.open and host.modules.uvm_disable_hmm and host.modules.blacklist_nouveau
    assert (
        host.boot.iommu and host.boot.iommu_passthrough is None and host.boot.acs_override is None
    )
    assert host.p2p.expected == "auto" and host.guests == [] and host.boot.snp == "keep"


@pytest.mark.parametrize("inventory", ["kpro6", "kpro5"])
def test_shipped_inventories_validate(inventory: str) -> None:
    hosts = load_inventory(ROOT / "inventory" / f"{inventory}.py")
    host_spec, data = hosts[inventory]
    assert data["ssh_hostname"] == f"{inventory}.lan"
    assert host_spec.guests


def test_kpro6_shape() -> None:
    host_spec, _ = load_inventory(ROOT / "inventory" / "kpro6.py")["kpro6"]
    (vm,) = host_spec.vm_guests
    (ct,) = host_spec.lxc_guests
    assert (vm.vmid, vm.machine, vm.gpus) == (129, "q35", ["0000:c1:00.0", "0000:e1:00.0"])
    assert (ct.ctid, ct.gpus, ct.cuda) == (200, "rest", ["12.8", "13.0"])
    assert host_spec.kernel.source == "build" and host_spec.toolchain.gcc == "12.2.0"


def test_bdf_is_normalized() -> None:
    data = spec(
        guests=[{"kind": "lxc", "ctid": 200, "name": "ct", "gpus": ["41:00.0", "0000:C1:00.0", 3]}]
    )
    assert HostSpec.model_validate(data).guests[0].gpus == ["0000:41:00.0", "0000:c1:00.0", 3]


def test_error_names_file_host_field_value_and_fix() -> None:
    (problem,) = problems(
        spec(guests=[{"kind": "lxc", "ctid": 200, "name": "ct", "gpus": ["41:00"]}])
    )
    assert problem.startswith("guests[0].gpus[0] = '41:00':")
    assert "write domain:bus:device.function, e.g. '0000:41:00.0'" in problem


def test_every_problem_is_reported_at_once() -> None:
    found = problems(
        {
            "kernel": {"version": "6.14"},
            "driver": {"version": "latest"},
            "boot": {"acs_override": "yes", "extra": ["intel_iommu=on"]},
            "colour": "blue",
        }
    )
    text = "\n".join(found)
    assert "kernel.version = '6.14'" in text and "e.g. '6.14.8-2-bpo12-pve'" in text
    assert "driver.version = 'latest'" in text
    assert "boot.acs_override = 'yes': 'yes' is not a pcie_acs_override value" in text
    assert "'downstream', 'multifunction' and 'id:vvvv:dddd'" in text
    assert "boot.extra[0] = 'intel_iommu=on'" in text and "use boot.iommu" in text
    assert "colour: unknown field" in text
    assert len(found) == 5


def test_missing_required_fields() -> None:
    assert problems({}) == [
        "kernel: required field is missing",
        "driver: required field is missing",
    ]


def test_vm_with_gpus_must_be_q35() -> None:
    (problem,) = problems(
        spec(
            guests=[
                {"kind": "vm", "vmid": 129, "name": "vm", "machine": "pc-i440fx-8.1", "gpus": [0]}
            ]
        )
    )
    assert problem.startswith("guests[0].machine = 'pc-i440fx-8.1': 'pc-i440fx-8.1' is not q35")
    ok = spec(
        guests=[{"kind": "vm", "vmid": 129, "name": "vm", "machine": "pc-q35-8.1", "gpus": [0]}]
    )
    assert HostSpec.model_validate(ok).vm_guests[0].machine == "pc-q35-8.1"
    # a VM without GPUs may keep any machine type
    HostSpec.model_validate(
        spec(guests=[{"kind": "vm", "vmid": 130, "name": "v", "machine": "pc-i440fx-8.1"}])
    )


def test_guest_ids_names_and_gpus_are_unique() -> None:
    text = "\n".join(
        problems(
            spec(
                guests=[
                    {"kind": "lxc", "ctid": 200, "name": "a", "gpus": [0, "0000:41:00.0"]},
                    {"kind": "vm", "vmid": 200, "name": "b", "machine": "q35", "gpus": [1]},
                ]
            )
        )
    )
    assert "guests[1]: id 200 is already used by guests[0]" in text
    dup_gpu = problems(
        spec(
            guests=[
                {"kind": "lxc", "ctid": 200, "name": "a", "gpus": [0]},
                {"kind": "lxc", "ctid": 201, "name": "b", "gpus": [0]},
            ]
        )
    )
    assert "guests[1]: GPU 0 is already given to guests[0]" in dup_gpu[0]
    same_list = problems(spec(guests=[{"kind": "lxc", "ctid": 200, "name": "a", "gpus": [1, 1]}]))
    assert "listed twice" in same_list[0]


def test_only_one_guest_takes_the_rest() -> None:
    (problem,) = problems(
        spec(
            guests=[
                {"kind": "lxc", "ctid": 200, "name": "a", "gpus": "rest"},
                {"kind": "lxc", "ctid": 201, "name": "b", "gpus": "rest"},
            ]
        )
    )
    assert "only one guest may take 'rest'" in problem


def test_cuda_needs_a_new_enough_driver() -> None:
    data = {
        **BASE,
        "driver": {"version": "570.133.07"},
        "guests": [{"kind": "lxc", "ctid": 200, "name": "a", "cuda": ["12.8", "13.0"]}],
    }
    (problem,) = problems(data)
    assert (
        "guests[0].cuda: CUDA 13.0 needs driver 580 or newer, but driver.version is 570.133.07"
        in problem
    )
    (unknown,) = problems(
        {**BASE, "guests": [{"kind": "lxc", "ctid": 200, "name": "a", "cuda": ["11.8"]}]}
    )
    assert "choose one of 12.8" in unknown


def test_source_build_needs_a_recipe() -> None:
    (problem,) = problems(spec(kernel={"version": "6.14.8-2-bpo12-pve", "source": "build"}))
    assert "needs a `build` recipe" in problem
    (bad_config,) = problems(
        spec(
            kernel={
                "version": "6.14.8-2-bpo12-pve",
                "source": "build",
                "build": {"repo": "/src", "config": {"VFIO": "y"}},
            }
        )
    )
    assert "guests" not in bad_config and "'CONFIG_VFIO_PCI'" in bad_config


def test_gpu_host_entry_for_pyinfra() -> None:
    name, data = gpu_host("kpro6", BASE, source="inventory/kpro6.py", ssh_hostname="10.0.0.6")
    assert name == "kpro6" and data["ssh_hostname"] == "10.0.0.6"
    assert isinstance(data["gpuhost"], HostSpec)
