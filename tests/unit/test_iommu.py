"""IOMMU parameters: what gpuhost writes and what it refuses (rules in gpuhost/plan/boot/iommu.py)."""

from typing import Any

import pytest

from gpuhost.observe.kernel import KernelCmdline
from gpuhost.plan.boot.iommu import plan_iommu
from tests.unit.conftest import captured

GRUB = "/etc/default/grub:9"


def plan(configured: list[str] | None = None, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "cpu_vendor": "amd",
        "snp_host": False,
        "iommu": True,
        "iommu_passthrough": None,
        "snp": "keep",
        "acs_override": None,
        "pci_realloc": False,
        "extra": [],
        "configured": [(p, GRUB) for p in configured or []],
        "running": [],
        "iommu_active": True,
    }
    return plan_iommu(**{**args, **kw})


def test_amd_writes_nothing_for_the_iommu() -> None:
    result = plan(iommu_passthrough=False)
    assert result.wanted == () and result.refusals == () and not result.identity_domains


def test_amd_iommu_on_is_never_written_and_is_flagged_when_found() -> None:
    result = plan(["quiet", "amd_iommu=on", "iommu=pt"])
    assert "amd_iommu=on" not in result.wanted and result.wanted == ()  # iommu=pt is the user's
    assert any("amd_iommu=on" in n and "Unknown option" in n for n in result.notes)


def test_intel_writes_intel_iommu_on_and_auto_passthrough() -> None:
    result = plan(cpu_vendor="intel")
    assert result.wanted == ("intel_iommu=on", "iommu=pt") and result.identity_domains
    assert any("CONFIG_INTEL_IOMMU_DEFAULT_ON" in n for n in result.notes)


def test_user_values_that_satisfy_the_plan_are_kept() -> None:
    result = plan(["intel_iommu=on,igfx_off", "iommu.passthrough=1"], cpu_vendor="intel")
    assert result.wanted == () and result.refusals == () and result.identity_domains
    assert plan(["amd_iommu=force_isolation"]).wanted == ("iommu=pt",)


def test_user_iommu_off_is_refused_not_removed() -> None:
    result = plan(["intel_iommu=off"], cpu_vendor="intel")
    assert result.refusals and "intel_iommu=off" in result.refusals[0]
    assert GRUB in result.refusals[0] and "boot.iommu: false" in result.refusals[0]
    assert "intel_iommu=on" not in result.wanted
    assert plan(["amd_iommu=off"]).refusals and plan(["iommu=off"]).refusals
    # on, then off: the kernel reads left to right
    assert plan(["intel_iommu=on,off"], cpu_vendor="intel").refusals


def test_user_nopt_contradicts_planned_passthrough() -> None:
    for param in ("iommu=nopt", "iommu.passthrough=0"):
        result = plan([param], iommu_passthrough=True)
        assert len(result.refusals) == 1 and param in result.refusals[0]
    # the last one wins: nopt overridden by a later iommu=pt
    assert plan(["iommu=nopt", "iommu=pt"]).refusals == ()


def test_snp_host_keeps_translated_domains() -> None:
    result = plan(snp_host=True)
    assert "iommu=pt" not in result.wanted and not result.identity_domains
    assert any("translated" in n for n in result.notes)


def test_snp_host_refuses_passthrough_unless_given_up() -> None:
    assert "boot.snp: give_up" in plan(snp_host=True, iommu_passthrough=True).refusals[0]
    user = plan(["iommu=pt"], snp_host=True)
    assert GRUB in user.refusals[0] and "boot.snp: give_up" in user.refusals[0]
    given_up = plan(snp_host=True, snp="give_up")
    assert given_up.wanted == ("iommu=pt",) and given_up.identity_domains
    assert any("SEV-SNP guests cannot start" in n for n in given_up.notes)


def test_passthrough_false_refuses_a_users_pt() -> None:
    result = plan(["iommu=pt"], iommu_passthrough=False)
    assert "boot.iommu_passthrough: true" in result.refusals[0]


def test_other_managed_parameters() -> None:
    result = plan(
        ["pci=nocrs,realloc"],
        acs_override="downstream,multifunction",
        pci_realloc=True,
        extra=["pcie_aspm=off"],
        iommu_passthrough=False,
    )
    assert result.wanted == ("pcie_acs_override=downstream,multifunction", "pcie_aspm=off")
    clash = plan(["pci=realloc=off", "pcie_aspm=force"], pci_realloc=True, extra=["pcie_aspm=off"])
    assert len(clash.refusals) == 2 and "pci=realloc=off" in clash.refusals[0]


def test_iommu_not_active_now() -> None:
    result = plan(iommu_active=False, iommu_passthrough=False)
    assert not result.iommu_active and any("AMD-Vi" in n for n in result.notes)


def test_on_the_real_capture() -> None:
    # the H200 microVM: Intel CPU, no IOMMU exposed; its command line is the loader's, not a
    # user's boot config, but it shows the running-kernel side
    running = KernelCmdline().process(captured("h200x1", "KernelCmdline"))
    result = plan(cpu_vendor="intel", running=running, iommu_active=False)
    assert result.wanted == ("intel_iommu=on", "iommu=pt") and any(
        "VT-d" in n for n in result.notes
    )


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        plan(cpu_vendor="arm")
    with pytest.raises(ValueError):
        plan(snp="maybe")
