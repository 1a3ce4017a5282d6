"""The planner on real captures (2x H200) and on constructed kpro6-shaped facts."""

import base64
from dataclasses import replace

import pytest

from gpuhost.plan.driver.modconf import NVIDIA_OPTIONS
from gpuhost.plan.make import make_plan
from gpuhost.plan.model import HOST, Owner, PlanError
from gpuhost.plan.phases import PARAMETERS
from gpuhost.plan.reasons import reboot_reasons
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


# --- command line --------------------------------------------------------------------------------


def test_group_check_waits_for_a_pending_acs_override() -> None:
    spec = host(KPRO6, vm(129, ["0000:c1:00.0"]), boot={"acs_override": "downstream,multifunction"})
    plan = make_plan("kpro6", spec, kpro6(lumped=True))  # the override is not on the cmdline yet
    assert "+pcie_acs_override=downstream,multifunction" in " ".join(
        f"+{p}" for p in plan.cmdline_add
    )
    assert any(
        n.startswith(
            "IOMMU group 100 is split: 0000:c1:00.0 goes to vm 129 (vm129) but 0000:e1:00.0 goes to host"
        )
        and n.endswith("is not active yet: checked again after the reboot")
        for n in plan.notes
    ), plan.notes
    # once the override is active and the group is still lumped, the plan is refused
    raw = kpro6_raw(lumped=True)
    raw["KernelCmdline"] = (
        0,
        ["root=/dev/sda1 amd_iommu=on pcie_acs_override=downstream,multifunction"],
    )
    assert any("IOMMU group 100 is split" in p for p in refused(spec, kpro6(lumped=True, **raw)))


def test_group_check_waits_for_the_iommu_to_be_on() -> None:
    raw = kpro6_raw()
    raw["IommuGroups"] = (0, [])
    raw["PciDevices"] = (0, [line for line in raw["PciDevices"][1] if " iommu_group " not in line])
    plan = make_plan("kpro6", host(KPRO6, vm(129, [7])), kpro6(**raw))
    assert plan.gpus[7].iommu_group is None
    assert any("IOMMU groups are not visible" in n for n in plan.notes)


# --- the kernel command line in the boot loader's files -------------------------------------------


def files(**contents: str) -> tuple[int, list[str]]:
    """The ConfigFiles fact's raw output for these files (path given with / as __)."""
    lines = []
    for key, text in contents.items():
        path = "/" + key.replace("__", "/").replace("_dot_", ".").replace("_dash_", "-")
        lines.append(f"F {path} {base64.b64encode(text.encode()).decode()}")
    return (0, lines)


CMDLINE = "etc__kernel__cmdline"
RECORD = "etc__gpuhost__kernel_dash_cmdline"


def test_cmdline_adds_only_what_the_user_does_not_have() -> None:
    facts = kpro6(ConfigFiles=files(**{CMDLINE: "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet\n"}))
    plan = make_plan("kpro6", host(KPRO6, boot={"pci_realloc": True}), facts)
    # AMD: the IOMMU is on by default and amd_iommu=on is not a kernel option: never written
    assert plan.cmdline_owned == ["iommu=pt", "pci=realloc"]
    assert plan.files["/etc/kernel/cmdline"].content == (
        "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet iommu=pt pci=realloc\n"
    )
    assert plan.files["/etc/gpuhost/kernel-cmdline"].content.splitlines()[1:] == [
        "iommu=pt",
        "pci=realloc",
    ]


def test_cmdline_keeps_the_users_iommu_values() -> None:
    user = "root=/dev/sda1 amd_iommu=force_isolation iommu.passthrough=1\n"
    plan = make_plan("kpro6", host(KPRO6), kpro6(ConfigFiles=files(**{CMDLINE: user})))
    assert plan.files["/etc/kernel/cmdline"].content == user  # already says what gpuhost wants
    assert plan.cmdline_owned == [] and plan.files["/etc/gpuhost/kernel-cmdline"].content is None


def test_cmdline_value_that_contradicts_the_plan_is_refused_not_removed() -> None:
    user = "root=/dev/sda1 amd_iommu=off\n"
    (problem,) = refused(host(KPRO6), kpro6(ConfigFiles=files(**{CMDLINE: user})))
    assert "amd_iommu=off (configured at /etc/kernel/cmdline) turns the IOMMU off" in problem


def test_cmdline_setting_turned_off_removes_what_gpuhost_wrote() -> None:
    current = {
        CMDLINE: "root=/dev/sda1 quiet iommu=pt pci=realloc\n",
        RECORD: "# Managed by gpuhost\niommu=pt\npci=realloc\n",
    }
    raw = {"ConfigFiles": files(**current)}
    raw["KernelCmdline"] = (0, ["root=/dev/sda1 quiet iommu=pt pci=realloc"])
    plan = make_plan("kpro6", host(KPRO6), kpro6(**raw))
    assert plan.files["/etc/kernel/cmdline"].content == "root=/dev/sda1 quiet iommu=pt\n"
    assert plan.cmdline_absent == ["pci=realloc"] and plan.cmdline_remove == ["pci=realloc"]
    assert "kernel command line changes: -pci=realloc" in [str(r) for r in plan.reboot_reasons]


def test_cmdline_parameters_go_before_the_init_arguments() -> None:
    current = {CMDLINE: "root=/dev/vda -- --firecracker-init iommu=pt\n"}
    plan = make_plan("kpro6", host(KPRO6), kpro6(ConfigFiles=files(**current)))
    assert plan.files["/etc/kernel/cmdline"].content == (
        "root=/dev/vda iommu=pt -- --firecracker-init iommu=pt\n"
    )


def test_grub_parameters_go_to_gpuhosts_own_dropin() -> None:
    grub = 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash" # my comment\n'
    raw = {
        "ConfigFiles": files(etc__default__grub=grub),
        "BootTool": (127, []),
        "BootKernelList": (127, []),
    }
    plan = make_plan("kpro6", host(KPRO6, boot={"pci_realloc": True}), kpro6(**raw))
    assert plan.loader == "grub" and "/etc/default/grub" not in plan.files  # the user's file
    dropin = plan.files["/etc/default/grub.d/zz-gpuhost.cfg"].content
    assert "iommu=pt" in dropin and "pci=realloc" in dropin


def test_grub_single_quoted_iommu_off_is_refused_before_any_reboot() -> None:
    grub = "GRUB_CMDLINE_LINUX='console=ttyS0 intel_iommu=off'\n"
    raw = {
        "ConfigFiles": files(etc__default__grub=grub),
        "BootTool": (127, []),
        "BootKernelList": (127, []),
        "CpuVendor": (0, ["vendor_id\t: GenuineIntel"]),
    }
    (problem,) = refused(host(KPRO6), kpro6(**raw))
    assert "intel_iommu=off (configured at /etc/default/grub:1) turns the IOMMU off" in problem


def test_identity_domains_follow_sev_snp_not_the_gpu_architecture() -> None:
    # no SNP: Blackwell GPUs on the host driver get iommu=pt (auto), and asking for it is fine
    assert make_plan("kpro6", host(KPRO6), kpro6()).iommu_passthrough
    assert make_plan(
        "kpro6", host(KPRO6, boot={"iommu_passthrough": True}), kpro6()
    ).iommu_passthrough
    snp = {
        "SevSnp": (0, ["/sys/module/kvm_amd/parameters/sev_snp:Y", "cpuflag sev_snp"]),
        "PveGuestConfigs": (0, []),  # VM 129's hand-made hostpci entries: GPUs given twice
    }
    # SNP kept (default): no identity domains; P2P not relied on, NCCL_P2P_DISABLE for guests
    plan = make_plan("kpro6", host(KPRO6, lxc(200, "rest")), kpro6(**snp))
    assert not plan.iommu_passthrough and "iommu=pt" not in plan.cmdline_owned
    assert plan.guest_env[Owner("lxc", 200, "ct200")]["NCCL_P2P_DISABLE"] == "1"
    # asking for iommu=pt while keeping SNP is refused, with the way out
    (problem,) = refused(host(KPRO6, boot={"iommu_passthrough": True}), kpro6(**snp))
    assert "SEV-SNP" in problem and "boot.snp: give_up" in problem


# --- the kernel a reboot would start -------------------------------------------------------------


def test_a_reboot_never_starts_a_kernel_the_run_did_not_choose() -> None:
    # kpro6's kernel list has a newer 6.14 than the running 6.8.12 (an apt upgrade, say)
    plan = make_plan("kpro6", host(KPRO6, boot={"pci_realloc": True}), kpro6())
    assert plan.next_boot_kernel == "6.14.8-2-bpo12-pve" and plan.reboot_now
    assert plan.pin_running_kernel and "(kernel 6.8.12-9-pve is pinned first)" in render_plan(plan)


def test_no_pin_without_a_reboot() -> None:
    raw = kpro6_raw()
    raw["KernelCmdline"] = (0, ["root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet iommu=pt"])
    raw["ModuleParameters"] = (0, ["nvidia_uvm uvm_disable_hmm Y"])
    raw["PveGuestConfigs"] = (0, [])
    plan = make_plan("kpro6", host(KPRO6, lxc(200, "rest")), kpro6(**raw))
    assert not plan.reboot_now and not plan.pin_running_kernel


def test_kernel_pin_refusal_comes_with_the_other_problems() -> None:
    raw = kpro6_raw()
    raw["KernelBuildInfo"] = (
        0,
        [
            "Linux version 6.8.4-1-pve (build@proxmox) (gcc (Debian 12.2.0-14) 12.2.0, GNU ld "
            "(GNU Binutils for Debian) 2.40) #1 SMP PREEMPT_DYNAMIC PMX 6.8.4-1 (2024-04-30T11:25Z)"
        ],
    )
    problems = refused(host(KPRO6, vm(129, ["0000:42:00.0"])), kpro6(**raw))
    assert any("0000:42:00.0 is not an NVIDIA GPU" in p for p in problems)
    assert any(
        "not the running 6.8.4-1-pve, which proxmox-boot-tool does not list" in p for p in problems
    )


def test_the_printed_plan_never_shows_a_secret_env_value() -> None:
    guest = lxc(200, "rest", env={"HF_TOKEN": "hf_abcdef0123456789", "NCCL_IB_DISABLE": "1"})
    text = render_plan(make_plan("kpro6", host(KPRO6, guest), kpro6(PveGuestConfigs=(0, []))))
    assert "HF_TOKEN=***" in text and "NCCL_IB_DISABLE=1" in text
    assert "hf_abcdef0123456789" not in text


def test_any_planned_module_parameter_that_reads_otherwise_reboots() -> None:
    """Not only nvidia_uvm's: a parameter of any module the plan sets, read otherwise on the
    loaded module, is a reason to reboot, and reads as planned it is none."""
    spec = host(KPRO6, lxc(200, "rest"))
    planned = {"nvidia": {"NVreg_EnableGpuFirmware": "1"}, "nvidia_uvm": {"uvm_disable_hmm": "Y"}}
    live = ["nvidia_uvm uvm_disable_hmm Y", "nvidia NVreg_EnableGpuFirmware 0"]
    reasons = reboot_reasons(spec, kpro6(ModuleParameters=(0, live)), [], [], [], {}, planned, [])
    assert [str(r) for r in reasons if r.concern == "modules"] == [
        "nvidia NVreg_EnableGpuFirmware is 0, must be 1 (module reload)"
    ]
    live[1] = "nvidia NVreg_EnableGpuFirmware 1"
    reasons = reboot_reasons(spec, kpro6(ModuleParameters=(0, live)), [], [], [], {}, planned, [])
    assert [r for r in reasons if r.concern == "modules"] == []


def test_every_spec_module_option_is_planned_with_its_reading() -> None:
    """Each module option the spec can set is planned on modprobe.d and as the reading the audit
    and the reboot reasons compare (one table, gpuhost/plan/phases.py PARAMETERS)."""
    raw = kpro6_raw()
    raw["PveGuestConfigs"] = (0, [])  # VM 129's hand-made hostpci entries would give GPUs twice
    spec = host(KPRO6, lxc(200, "rest"), modules={"uvm_disable_hmm": True})
    plan = make_plan("kpro6", spec, kpro6(**raw))
    for module, name, value, reads in PARAMETERS.values():
        assert plan.module_options[module][name] == value
        assert plan.expected_parameters[module][name] == reads
        assert f"{name}={value}" in (plan.files[NVIDIA_OPTIONS].content or "")
