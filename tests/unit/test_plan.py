"""The planner on real captures (2x H200) and on constructed kpro6-shaped facts."""

from dataclasses import replace

import pytest

from gpuhost.plan.make import make_plan
from gpuhost.plan.model import HOST, Owner, PlanError
from gpuhost.plan.render import render_plan
from gpuhost.spec.host import HostSpec
from tests.unit.hosts import h200x2 as h200x2_facts
from tests.unit.hosts import kpro6, kpro6_raw

H200 = {"kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "580.159.04"}}
KPRO6 = {"kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "580.95.05"}}


def host(base: dict, *guests: dict, **fields: object) -> HostSpec:
    return HostSpec.model_validate({**base, "guests": list(guests), **fields})


def lxc(ctid: int, gpus: object, **kw: object) -> dict:
    return {"kind": "lxc", "ctid": ctid, "name": f"ct{ctid}", "gpus": gpus, **kw}


def vm(vmid: int, gpus: object, **kw: object) -> dict:
    return {"kind": "vm", "vmid": vmid, "name": f"vm{vmid}", "gpus": gpus, "machine": "q35", **kw}


def refused(spec: HostSpec, facts: object) -> list[str]:
    with pytest.raises(PlanError) as info:
        make_plan("kpro6", spec, facts)  # type: ignore[arg-type]
    return info.value.problems


# --- plans on the real 2x H200 capture ----------------------------------------------------------


def test_h200_split_between_container_and_vm() -> None:
    plan = make_plan("h200", host(H200, lxc(200, [0]), vm(129, ["00:07.0"])), h200x2_facts())
    assert [(g.bdf, g.driver_now, g.driver_planned, str(g.owner)) for g in plan.gpus] == [
        ("0000:00:06.0", "nvidia", "nvidia", "lxc 200 (ct200)"),
        ("0000:00:07.0", "nvidia", "vfio-pci", "vm 129 (vm129)"),
    ]
    assert plan.gpus[0].model == "NVIDIA H200" and plan.gpus[0].iommu_group is None
    assert "GPU 0000:00:07.0 binds vfio-pci (now nvidia)" in [str(r) for r in plan.reboot_reasons]
    assert plan.modules_load == {
        "nvidia": ["nvidia", "nvidia_uvm"],
        "vfio": ["vfio", "vfio_iommu_type1", "vfio_pci"],
    }
    assert plan.p2p == {}  # P2P only matters between GPUs of one owner on the host driver


def test_h200_pair_in_one_container_expects_nvlink_p2p() -> None:
    plan = make_plan("h200", host(H200, lxc(200, "rest")), h200x2_facts())
    assert plan.p2p == {("0000:00:06.0", "0000:00:07.0"): True}  # NV18 in the real topology
    assert plan.modules_load == {"nvidia": ["nvidia", "nvidia_uvm"]}
    # the real capture's cmdline: Intel CPU; its own pci=realloc=off is kept (not asked for)
    assert plan.cmdline_add == ["intel_iommu=on", "iommu=pt"] and plan.cmdline_remove == []
    assert plan.loader == "grub"  # no proxmox-boot-tool there
    assert "nvidia_uvm uvm_disable_hmm is N, must be Y (module reload)" in [
        str(r) for r in plan.reboot_reasons
    ]
    assert "kernel 6.8.12-9-pve must boot (running 6.18.44-fc-v657-gpu)" in [
        str(r) for r in plan.reboot_reasons
    ]


def test_h200_unassigned_gpus_stay_on_the_host() -> None:
    plan = make_plan("h200", host(H200, lxc(200, [1])), h200x2_facts())
    assert plan.gpus[0].owner == HOST and plan.gpus[1].owner == Owner("lxc", 200, "ct200")


def test_p2p_unsafe_iommu_disables_nccl_p2p() -> None:
    spec = host(H200, lxc(200, "rest"), p2p={"unsafe_iommu": True})
    plan = make_plan("h200", spec, h200x2_facts())
    assert plan.p2p == {("0000:00:06.0", "0000:00:07.0"): None}
    assert plan.guest_env[Owner("lxc", 200, "ct200")] == {"NCCL_P2P_DISABLE": "1"}


def test_p2p_unknown_without_driver() -> None:
    no_answers = {"r": None, "w": None}  # nvidia-smi cannot answer without the driver
    facts = h200x2_facts(topology=None, p2p=no_answers)
    plan = make_plan("h200", host(H200, lxc(200, "rest")), facts)
    assert plan.p2p == {("0000:00:06.0", "0000:00:07.0"): None}
    assert any(n.startswith("P2P: unknown until the nvidia driver runs") for n in plan.notes)


def test_driver_not_loaded_needs_reboot() -> None:
    plan = make_plan("h200", host(H200), h200x2_facts(driver=None))
    assert "NVIDIA driver 580.159.04 (open) must load (none loaded)" in [
        str(r) for r in plan.reboot_reasons
    ]


# --- kpro6 ---------------------------------------------------------------------------------------


def test_kpro6_split() -> None:
    spec = host(
        KPRO6,
        vm(129, ["0000:c1:00.0", "0000:e1:00.0"]),
        lxc(200, "rest"),
        boot={"pci_realloc": True},
    )
    plan = make_plan("kpro6", spec, kpro6())
    owners = [str(g.owner) for g in plan.gpus]
    assert owners == ["lxc 200 (ct200)"] * 6 + ["vm 129 (vm129)"] * 2
    assert [g.numa_node for g in plan.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert plan.gpus[6].functions == ("0000:c1:00.1",)  # the audio function goes with the GPU
    assert plan.loader == "systemd-boot"
    # AMD: the IOMMU is on by default (amd_iommu=on is no kernel option); no SEV-SNP: iommu=pt
    assert plan.cmdline_add == ["iommu=pt", "pci=realloc"]
    assert "pcie_aspm=off" in plan.cmdline  # the user's own parameter survives
    assert set(plan.p2p.values()) == {False}  # each GPU on its own root port: NODE/SYS, no P2P
    assert len(plan.p2p) == 15  # pairs among the container's 6 GPUs
    text = render_plan(plan)
    assert (
        "0000:c1:00.0  NVIDIA RTX PRO 6000 Blackwell Workstation Edition  1     16     nvidia -> vfio-pci"
        in text
    )
    assert "P2P within lxc 200 (ct200): not supported for all 15 pair(s)" in text


def test_converged_host_needs_no_reboot() -> None:
    spec = host(KPRO6, lxc(200, "rest"), modules={"uvm_disable_hmm": True})
    raw = kpro6_raw()
    raw["KernelCmdline"] = (0, ["root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet iommu=pt"])
    raw["ModuleParameters"] = (0, ["nvidia_uvm uvm_disable_hmm Y"])
    raw["PveGuestConfigs"] = (0, [])  # VM 129's hand-made hostpci entries would give GPUs twice
    plan = make_plan("kpro6", spec, kpro6(**raw))
    assert plan.reboot_reasons == [] and not plan.needs_reboot
    assert "no reboot needed" in render_plan(plan)


# --- refusals ------------------------------------------------------------------------------------


def test_refuses_unknown_bdf() -> None:
    (problem,) = refused(host(KPRO6, lxc(200, ["0000:42:00.0"])), kpro6())
    assert problem.startswith(
        "guests[0] (lxc 200 (ct200)): 0000:42:00.0 is not an NVIDIA GPU on this host"
    )
    (audio,) = refused(host(KPRO6, lxc(200, ["0000:41:00.1"])), kpro6())
    assert "0000:41:00.1 is not an NVIDIA GPU" in audio


def test_refuses_gpu_given_to_two_owners() -> None:
    (problem,) = refused(host(KPRO6, lxc(200, [2]), vm(129, ["0000:41:00.0"])), kpro6())
    assert (
        "GPU 0000:41:00.0 (named as 0000:41:00.0) is already given to lxc 200 (ct200) (named as index 2)"
        in problem
    )


def test_refuses_more_gpus_than_exist() -> None:
    problems = refused(host(H200, lxc(200, [0, 1, 2])), h200x2_facts())
    assert "the guests ask for 3 GPUs but this host has 2" in problems
    assert any(
        "GPU index 2 does not exist; this host has 2 NVIDIA GPU(s) (indexes 0-1)" in p
        for p in problems
    )
    (rest,) = refused(host(H200, lxc(200, [0, 1]), lxc(201, "rest")), h200x2_facts())
    assert "takes 'rest' of the GPUs, but all 2 GPU(s) are already given to other guests" in rest


def test_refuses_split_iommu_group() -> None:
    problems = refused(
        host(KPRO6, vm(129, ["0000:c1:00.0"]), lxc(200, ["0000:e1:00.0"])), kpro6(lumped=True)
    )
    assert any(
        "IOMMU group 100 is split: 0000:c1:00.0 goes to vm 129 (vm129) but 0000:e1:00.0 goes to lxc 200 (ct200)"
        in p
        for p in problems
    )


def test_refuses_group_shared_with_unassigned_device() -> None:
    problems = refused(host(KPRO6, vm(129, ["0000:c1:00.0", "0000:e1:00.0"])), kpro6(lumped=True))
    assert problems and all(
        "also holds 0000:c0:08.0 ([0106] 1022:7901, driver ahci)" in p for p in problems
    )
    # without the stray SATA controller the same VM may take both boards of the group
    raw = kpro6_raw(lumped=True)
    pci = [line for line in raw["PciDevices"][1] if "0000:c0:08.0" not in line]  # unplug it
    groups = [line.replace(" 0000:c0:08.0", "") for line in raw["IommuGroups"][1]]
    facts = kpro6(lumped=True, PciDevices=(0, pci), IommuGroups=(0, groups))
    plan = make_plan("kpro6", host(KPRO6, vm(129, ["0000:c1:00.0", "0000:e1:00.0"])), facts)
    assert {g.iommu_group for g in plan.gpus if g.owner.kind == "vm"} == {100}


def test_refuses_group_split_with_the_host() -> None:
    (problem,) = refused(
        host(KPRO6, vm(129, ["0000:c1:00.0"])),
        kpro6(
            lumped=True,
            PciDevices=(0, [x for x in kpro6_raw(True)["PciDevices"][1] if "c0:08.0" not in x]),
        ),
    )
    assert "0000:c1:00.0 goes to vm 129 (vm129) but 0000:e1:00.0 goes to host" in problem


def test_refuses_vm_that_is_not_q35() -> None:
    configs = kpro6().guest_configs
    i440fx = replace(
        configs[("qemu", 129)],
        current=replace(configs[("qemu", 129)].current, options={"name": "vm129"}),
    )
    facts = replace(kpro6(), guest_configs={("qemu", 129): i440fx})
    (problem,) = refused(host(KPRO6, vm(129, [7], machine=None)), facts)
    assert (
        "vm 129 (vm129) gets GPUs but its machine type is i440fx (the default, no 'machine' key)"
        in problem
    )
    assert "set machine: q35" in problem
    # the live config on this host is q35 already: no machine in the spec is fine
    assert (
        make_plan("kpro6", host(KPRO6, vm(129, [7], machine=None)), kpro6()).gpus[7].driver_planned
        == "vfio-pci"
    )
    (missing,) = refused(host(KPRO6, vm(131, [7], machine=None)), kpro6())
    assert "vm 131 (vm131) gets GPUs but does not exist here" in missing


def test_refuses_proprietary_modules_on_blackwell() -> None:
    spec = host({**KPRO6, "driver": {"version": "580.95.05", "open": False}})
    (problem,) = refused(spec, kpro6())
    assert problem.startswith("driver.open is false but 0000:01:00.0, 0000:21:00.0")
    assert "set driver.open: true" in problem
    # Hopper runs either flavour
    make_plan(
        "h200", host({**H200, "driver": {"version": "580.159.04", "open": False}}), h200x2_facts()
    )


def test_refuses_running_kernel_built_by_another_compiler() -> None:
    spec = host(
        {
            "kernel": {"version": "6.8.12-9-pve"},
            "driver": {"version": "580.95.05"},
            "toolchain": {"gcc": "13.2.0"},
        }
    )
    (problem,) = refused(spec, kpro6())
    assert (
        "the running kernel 6.8.12-9-pve was built by gcc 12.2.0 but toolchain.gcc is 13.2.0"
        in problem
    )


def test_every_refusal_is_listed_at_once() -> None:
    spec = host(KPRO6, lxc(200, [9, "0000:42:00.0"]), vm(129, [10]))
    assert len(refused(spec, kpro6())) >= 3
