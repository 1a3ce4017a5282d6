"""The Plan's boot loader files: the kernel command line gpuhost owns (IOMMU, ACS, the user's
extra parameters and, while a trial boot is due, its panic parameters), for systemd-boot's
/etc/kernel/cmdline or GRUB's drop-in. Pure: from the spec and the host's facts."""

from __future__ import annotations

from dataclasses import replace

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.boot import cmdline as bootconf
from gpuhost.plan.boot.iommu import plan_iommu
from gpuhost.spec.host import HostSpec


def loader_files(facts: HostFacts, loader: str) -> dict[str, str]:
    if facts.files is not None:
        return facts.files
    # A snapshot taken without the boot loader's files: judge by /proc/cmdline.
    base = [p for p in facts.cmdline if not p.startswith(("BOOT_IMAGE=", "initrd="))]
    if loader == "systemd-boot":
        return {bootconf.KERNEL_CMDLINE: " ".join(base) + "\n"}
    return {bootconf.DEFAULT_GRUB: f'GRUB_CMDLINE_LINUX="{" ".join(base)}"\n'}


def boot_config(
    spec: HostSpec,
    facts: HostFacts,
    loader: str,
    problems: list[str],
    notes: list[str],
    trial_params: tuple[str, ...] = (),
    transient: frozenset[str] = frozenset(),
) -> tuple[bootconf.BootConfig, bool]:
    """The boot loader files and whether host devices get identity domains (iommu=pt).

    ``trial_params`` go on the command line while a trial boot is due or under way. Once it is
    done they leave the files, but a running kernel booted with them is not a reason to reboot
    (they only make a failing kernel reboot by itself): parameters named in ``transient`` (the
    trial's, from the caller that plans the trial) are never "absent"."""
    files = loader_files(facts, loader)
    configured, trouble = bootconf.configured(loader, files)
    problems += trouble
    boot = spec.boot
    iommu = plan_iommu(
        cpu_vendor=facts.cpu_vendor,
        snp_host=facts.sev.snp_host,
        iommu=boot.iommu,
        iommu_passthrough=boot.iommu_passthrough,
        snp=boot.snp,
        acs_override=boot.acs_override,
        pci_realloc=boot.pci_realloc,
        extra=boot.extra,
        configured=configured,
        running=facts.cmdline,
        iommu_active=facts.iommu.active or bool(facts.iommu_groups),
    )
    problems += iommu.refusals
    notes += iommu.notes
    wanted = list(iommu.wanted) + [p for p in trial_params if p not in iommu.wanted]
    if loader == "systemd-boot":
        config = bootconf.systemd_boot(files, wanted)
    else:
        config = bootconf.grub(files, [p for p, _ in configured], wanted)
    problems += config.problems
    config = replace(
        config, absent=[p for p in config.absent if p.split("=", 1)[0] not in transient]
    )
    return config, iommu.identity_domains


def after_commit(
    spec: HostSpec,
    facts: HostFacts,
    loader: str,
    boot: bootconf.BootConfig,
    trial_params: tuple[str, ...],
) -> dict[str, str | None]:
    """The loader files that change at the trial's commit, as they must be then (path ->
    content; None: absent): without the trial's panic parameters. The commit writes them in the
    run that commits, and its own loader refresh applies them, so the next run is a no-op."""
    if not trial_params:
        return {}
    settled, _ = boot_config(spec, facts, loader, [], [], ())
    return {p: c for p, c in settled.files.items() if boot.files.get(p) != c}
