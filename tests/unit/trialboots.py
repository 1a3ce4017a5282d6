"""Trial boots planned on each boot path of tests/fixtures/proxmox/facts, for the trial-boot
planning tests (test_trialboot.py, test_trialboot_grub.py)."""

from gpuhost.observe.boot import parse_boot_path
from gpuhost.observe.proxmox import parse_boot_tool_status
from gpuhost.plan.trial.boot import TrialBoot, plan_trial_boot
from tests.unit.conftest import proxmox

OLD, NEW = "6.8.12-9-pve", "6.14.8-2-bpo12-pve"
G = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
ZFS_DEVID = "5f3a1c2e9b7d4e80"
LVM_DEVID = "2b1f6a0c-5e3d-4c8a-9f71-0d4e2a6b8c13"
PLAIN_DEVID = "9c0e4d1a-77b2-4f0e-a3c5-6e8f1b2d4a90"
UNCONFIGURED = parse_boot_tool_status(proxmox("boot-tool-status-unconfigured.out"))


PLANNED = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on iommu=pt"
PLANNED_GRUB = "root=/dev/mapper/pve-root ro quiet intel_iommu=on iommu=pt"


def systemd_boot(running: str = OLD, **kw: object) -> TrialBoot:
    kw.setdefault("options", PLANNED)
    return plan_trial_boot(
        running,
        NEW,
        parse_boot_path(proxmox("boot-path-systemd-boot.out")),
        parse_boot_tool_status(proxmox("boot-tool-status-uefi.out")),
        **kw,  # type: ignore[arg-type]
    )


def grub_esp(running: str = OLD, **kw: object) -> TrialBoot:
    kw.setdefault("options", PLANNED)
    return plan_trial_boot(
        running,
        NEW,
        parse_boot_path(proxmox("boot-path-grub-esp.out")),
        parse_boot_tool_status(proxmox("boot-tool-status-grub-esp.out")),
        **kw,  # type: ignore[arg-type]
    )


def grub_lvm(running: str = OLD, **kw: object) -> TrialBoot:
    kw.setdefault("options", PLANNED_GRUB)
    path = parse_boot_path(proxmox("boot-path-grub-lvm.out"))
    return plan_trial_boot(running, NEW, path, UNCONFIGURED, **kw)  # type: ignore[arg-type]


def grub_plain(running: str = OLD, **kw: object) -> TrialBoot:
    kw.setdefault("options", PLANNED_GRUB)
    path = parse_boot_path(proxmox("boot-path-grub-plain.out"))
    return plan_trial_boot(running, NEW, path, UNCONFIGURED, **kw)  # type: ignore[arg-type]


def every_command(trial: TrialBoot) -> list[str]:
    steps = (trial.checks, trial.pin_running, trial.prepare, trial.oneshot)
    steps += (trial.confirm, trial.commit, trial.abandon, trial.before_deadline_reboot)
    return [c for step in steps for c in step]
