"""The planner's boot side: the kernel command line (running, and in the boot loader's files),
the kernel a reboot starts, and the module parameters that make a reboot."""

import base64

from gpuhost.plan.driver.modconf import NVIDIA_OPTIONS
from gpuhost.plan.make import make_plan
from gpuhost.plan.model import Owner
from gpuhost.plan.phases import PARAMETERS
from gpuhost.plan.reasons import reboot_reasons
from gpuhost.plan.render import render_plan
from tests.unit.hosts import kpro6, kpro6_raw
from tests.unit.test_plan import KPRO6, host, lxc, refused, vm

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
