"""The Plan's trial boot: planned when the spec's kernel is not the running one, shown by the
renderer, never a reason to refuse the plan (no deploy runs it yet)."""

import pytest

from gpuhost.plan.boot.cmdline import KERNEL_CMDLINE
from gpuhost.plan.make import make_plan
from gpuhost.plan.model import PlanError
from gpuhost.plan.render import render_plan
from gpuhost.plan.trial.entry import TRIAL_ENTRY
from gpuhost.plan.trial.state import RECORD, Step
from gpuhost.spec.host import HostSpec
from tests.unit.conftest import proxmox
from tests.unit.hosts import kpro6

NEW = "6.14.8-2-bpo12-pve"  # kpro6 runs 6.8.12-9-pve


def spec(version: str = NEW, **trial: object) -> HostSpec:
    kernel = {"version": version, "trial": trial}
    return HostSpec.model_validate({"kernel": kernel, "driver": {"version": "580.95.05"}})


def test_a_new_command_line_on_the_running_kernel_is_tried_through_its_own_entry() -> None:
    """kpro6 runs the planned kernel, but the IOMMU parameters are not on its command line:
    the boot that applies them is a trial of the running kernel, never a plain reboot."""
    facts = kpro6(BootPath=(0, proxmox("boot-path-systemd-boot.out")))
    plan = make_plan("kpro6", spec("6.8.12-9-pve"), facts)
    trial = plan.trial_boot
    assert trial is not None and trial.can_apply and trial.same_kernel
    assert (plan.trial_step, trial.entry) == (Step.START, TRIAL_ENTRY)
    assert plan.boot_config_at_commit  # the loader files and initramfs wait for the commit
    planned = (plan.files[KERNEL_CMDLINE].content or "").split("\n")[0]
    assert trial.entry_options == f"{planned} {' '.join(trial.cmdline)}"
    assert plan.trial_commit_files[KERNEL_CMDLINE].content == plan.files[KERNEL_CMDLINE].content
    assert "the new boot configuration of kernel 6.8.12-9-pve" in trial.what


def test_systemd_boot_trial_is_planned_and_shown() -> None:
    facts = kpro6(BootPath=(0, proxmox("boot-path-systemd-boot.out")))
    plan = make_plan("kpro6", spec(panic_timeout=15, deadline_minutes=30), facts)
    trial = plan.trial_boot
    assert trial is not None and trial.can_apply
    assert (trial.method, trial.running, trial.kernel) == ("systemd-boot", "6.8.12-9-pve", NEW)
    assert trial.entry == TRIAL_ENTRY and trial.cmdline[0] == "panic=15"
    assert trial.deadline_s == 1800
    assert (plan.trial_step, plan.target_kernel) == (Step.START, NEW)
    line = next(x for x in render_plan(plan).splitlines() if "trial boot" in x)
    assert line == (
        "trial boot (start the trial boot): trial boot of "
        f"{NEW} via systemd-boot one-shot '{TRIAL_ENTRY}', 6.8.12-9-pve pinned until the "
        "checks pass"
    )


def test_lvm_grub_trial_is_refused_but_the_plan_stands() -> None:
    facts = kpro6(
        BootPath=(0, proxmox("boot-path-grub-lvm.out")),
        BootTool=(0, proxmox("boot-tool-status-unconfigured.out")),
    )
    plan = make_plan("kpro6", spec(), facts)
    assert plan.trial_boot is not None and not plan.trial_boot.can_apply
    assert plan.trial_boot.method == "grub-no-oneshot"
    assert "refused (grub-no-oneshot)" in render_plan(plan)
    opted_in = make_plan("kpro6", spec(without_oneshot=True), facts).trial_boot
    assert opted_in is not None and opted_in.can_apply


def test_old_snapshot_without_boot_path_shows_an_unknown_trial() -> None:
    plan = make_plan("kpro6", spec(), kpro6())
    assert plan.trial_boot is not None and plan.trial_boot.method == "unknown"
    assert "capture the facts again" in render_plan(plan)


def _with_record(record: str | None, boot_id: str) -> dict[str, tuple[int, list[str]]]:
    import base64

    cmdline = base64.b64encode(b"root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet\n").decode()
    files = [f"F /etc/kernel/cmdline {cmdline}"]
    if record is not None:
        files.append(f"F {RECORD} {base64.b64encode(record.encode()).decode()}")
    return {
        "BootPath": (0, proxmox("boot-path-systemd-boot.out")),
        "ConfigFiles": (0, files),
        "BootId": (0, [boot_id]),
    }


RECORDED = (
    f"kernel={NEW}\nprevious=6.8.12-9-pve\nboot_id={'1' * 8}-0000-0000-0000-{'0' * 12}\n"
    "deadline_s=1200\nmethod=systemd-boot\n"
)


def test_the_trial_step_comes_from_the_hosts_record() -> None:
    before = f"{'1' * 8}-0000-0000-0000-{'0' * 12}"
    after = f"{'2' * 8}-0000-0000-0000-{'0' * 12}"
    # the reboot did not happen yet (a run killed after writing the record): start again
    plan = make_plan("kpro6", spec(), kpro6(**_with_record(RECORDED, before)))
    assert plan.trial_step is Step.START
    # a new boot, but the old kernel runs: the trial failed; the deploy stops and says so
    plan = make_plan("kpro6", spec(), kpro6(**_with_record(RECORDED, after)))
    assert plan.trial_step is Step.FAILED and plan.trial_boot is not None
    assert "the trial boot failed" in render_plan(plan)


def test_a_damaged_record_refuses_the_plan_naming_it() -> None:
    with pytest.raises(PlanError, match="trial lacks previous, boot_id"):
        make_plan("kpro6", spec(), kpro6(**_with_record(f"kernel={NEW}\n", "3" * 36)))


TRIAL_PARAMS = [
    "panic=10",
    "oops=panic",
    "softlockup_panic=1",
    "nmi_watchdog=panic",
    "hung_task_panic=1",
    "gpuhost.trial=1",
]


def test_the_trial_boots_with_panic_parameters_in_its_own_entry_only() -> None:
    """From the run that starts the trial, a failing kernel reboots into the default by itself;
    the files every entry shares never get the parameters."""
    plan = make_plan("kpro6", spec(), kpro6(**_with_record(None, "1" * 36)))
    assert plan.trial_step is Step.START and plan.trial_boot is not None
    assert all(p in (plan.trial_boot.entry_options or "").split() for p in TRIAL_PARAMS)
    assert not any(p in plan.cmdline_present for p in TRIAL_PARAMS)
    line = plan.files["/etc/kernel/cmdline"].content or ""
    assert line.startswith("root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet ")
    assert not any(p in line.split() for p in TRIAL_PARAMS)


def test_plain_grub_puts_them_in_its_trial_entry_only() -> None:
    facts = kpro6(
        BootPath=(0, proxmox("boot-path-grub-lvm.out")),
        BootTool=(0, proxmox("boot-tool-status-unconfigured.out")),
    )
    plan = make_plan("kpro6", spec(without_oneshot=True), facts)
    assert plan.trial_step is Step.START and plan.boot_config_at_commit
    assert not any(p in plan.cmdline_present for p in TRIAL_PARAMS)
    trial = plan.trial_boot
    assert trial is not None and trial.entry == "gpuhost-trial" and trial.entry_options
    assert all(p in trial.entry_options.split() for p in TRIAL_PARAMS)


def test_grub_on_the_esps_puts_them_in_its_trial_entry_only() -> None:
    facts = kpro6(
        BootPath=(0, proxmox("boot-path-grub-esp.out")),
        BootTool=(0, proxmox("boot-tool-status-grub-esp.out")),
    )
    plan = make_plan("kpro6", spec(), facts)
    assert plan.trial_step is Step.START and plan.boot_config_at_commit
    assert not any(p in plan.cmdline_present for p in TRIAL_PARAMS)
    trial = plan.trial_boot
    assert trial is not None and trial.entry == "gpuhost-trial" and trial.entry_options


def test_after_the_commit_the_host_is_converged_and_panic_settings_go_back() -> None:
    """Converged on the trial entry's boot: it booted the planned line plus the trial's
    parameters; neither they nor the mark are a reboot reason, and the Plan wants the live
    panic settings off (the commit sets them, the audit checks them)."""
    import base64

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    first = make_plan("kpro6", spec("6.8.12-9-pve"), kpro6(**_with_record(None, "1" * 36)))
    planned = first.files[KERNEL_CMDLINE].content or ""
    record = first.files["/etc/gpuhost/kernel-cmdline"].content or ""
    booted = planned.split("\n")[0] + " " + " ".join(TRIAL_PARAMS)
    facts = kpro6(
        BootPath=(0, proxmox("boot-path-systemd-boot.out")),
        ConfigFiles=(
            0,
            [
                f"F /etc/kernel/cmdline {b64(planned)}",
                f"F /etc/gpuhost/kernel-cmdline {b64(record)}",
            ],
        ),
        KernelCmdline=(0, [f"initrd=\\EFI\\gpuhost-trial\\initrd.img-6.8.12-9-pve {booted}"]),
        ModuleParameters=(0, ["nvidia_uvm uvm_disable_hmm Y"]),
    )
    plan = make_plan("kpro6", spec("6.8.12-9-pve"), facts)
    assert plan.trial_step is Step.CONVERGED, plan.reboot_reasons
    assert not any(p in plan.cmdline_absent for p in TRIAL_PARAMS)
    reasons = " ".join(str(r) for r in plan.reboot_now + plan.reboot_later)
    assert "panic" not in reasons
    assert set(plan.panic_sysctls.values()) == {"0"}
