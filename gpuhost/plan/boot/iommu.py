"""IOMMU kernel parameters: what gpuhost writes, and what it refuses. Pure.

Kernel facts this module encodes (checked against the kernel sources, see the report of
issue 7 part 4):
- ``amd_iommu=`` knows fullflush, force_enable, off, force_isolation, pgtbl_v1/v2,
  irtcachedis, nohugepages, v2_pgsizes_only; anything else, ``on`` included, is logged as
  "AMD-Vi: Unknown option" and ignored (drivers/iommu/amd/init.c, parse_amd_iommu_options).
  The AMD IOMMU is on whenever the firmware describes one (IVRS), so gpuhost writes nothing
  for boot.iommu on AMD.
- ``intel_iommu=on|off`` (comma list, read left to right) overrides the build default
  CONFIG_INTEL_IOMMU_DEFAULT_ON, which Proxmox's 6.8+ kernels set (pve-docs
  qm-pci-passthrough.adoc). gpuhost still writes ``intel_iommu=on`` on Intel: the custom kernels
  it boots need not share that configuration, and the parameter is harmless where it is the
  default.
- ``iommu=pt``/``iommu=nopt`` (arch/x86/kernel/pci-dma.c) and ``iommu.passthrough=0|1``
  (drivers/iommu/iommu.c) set the default domain of host-driver devices: identity
  (untranslated) or translated. The last one on the command line wins.
- On an SEV-SNP host the AMD IOMMU driver withdraws SNP when the IOMMU is off or the default
  domain is passthrough ("SNP: IOMMU disabled or configured in passthrough mode, SNP cannot be
  supported", iommu_snp_enable in drivers/iommu/amd/init.c): so iommu=pt costs SNP, and keeping
  SNP means translated domains for host GPUs. SEV-SNP, not the GPU model, decides.

gpuhost never removes a parameter the user configured: a user value that already gives what
the plan needs is kept and nothing is added; one that contradicts the plan is a refusal that
names the parameter, where it is configured and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

AMD_IOMMU_OPTIONS = (
    "fullflush",
    "force_enable",
    "off",
    "force_isolation",
    "pgtbl_v1",
    "pgtbl_v2",
    "irtcachedis",
    "nohugepages",
    "v2_pgsizes_only",
)


@dataclass(frozen=True)
class IommuPlan:
    wanted: tuple[str, ...]  # the parameters gpuhost's own boot config carries, in order
    refusals: tuple[str, ...]  # contradictions between the spec and the user's parameters
    notes: tuple[str, ...]
    identity_domains: bool  # host-driver devices get identity (iommu=pt) domains after boot
    iommu_active: bool  # the running kernel has an IOMMU (units or groups in sysfs)


def _split(param: str) -> tuple[str, str | None]:
    name, sep, value = param.partition("=")
    return name, value if sep else None


def _tokens(value: str | None) -> list[str]:
    return [t for t in (value or "").split(",") if t]


def _last(
    configured: Sequence[tuple[str, str]], decide: dict[str, bool], names: tuple[str, ...]
) -> tuple[bool, str, str] | None:
    """The last decisive token among ``names=`` parameters: (state, param, origin)."""
    found = None
    for param, origin in configured:
        name, value = _split(param)
        if name not in names:
            continue
        for token in _tokens(value) if name != "iommu.passthrough" else [value or ""]:
            key = f"{name}={token}"
            if key in decide:
                found = (decide[key], param, origin)
    return found


_PASSTHROUGH = {
    "iommu=pt": True,
    "iommu=nopt": False,
    **{f"iommu.passthrough={v}": True for v in ("1", "y", "Y", "on")},
    **{f"iommu.passthrough={v}": False for v in ("0", "n", "N", "off")},
}


def plan_iommu(
    *,
    cpu_vendor: str,
    snp_host: bool,
    iommu: bool,
    iommu_passthrough: bool | None,
    snp: str,
    acs_override: str | None,
    pci_realloc: bool,
    extra: Sequence[str],
    configured: Sequence[tuple[str, str]],
    running: Sequence[str],
    iommu_active: bool,
) -> IommuPlan:
    """Decide gpuhost's IOMMU-related kernel parameters.

    ``snp_host``: the firmware has SEV-SNP on (facts SevSnp: the cpu flag). ``snp``: the spec's
    choice, 'keep' (no identity domains) or 'give_up' (iommu=pt allowed, SNP lost).
    ``configured``: the user's own parameters as the boot loader config gives them to the next
    boot, (parameter, origin such as "/etc/default/grub:9"), without gpuhost's own.
    ``running``: /proc/cmdline as a list. ``iommu_active``: facts IommuDomains().active.
    """
    if cpu_vendor not in ("intel", "amd"):
        raise ValueError(f"cpu vendor must be 'intel' or 'amd', not {cpu_vendor!r}")
    if snp not in ("keep", "give_up"):
        raise ValueError(f"snp must be 'keep' or 'give_up', not {snp!r}")
    wanted: list[str] = []
    refusals: list[str] = []
    notes: list[str] = []
    user = {param for param, _ in configured}

    # --- the IOMMU itself -------------------------------------------------------------------
    vendor_param = f"{cpu_vendor}_iommu"
    off_switches = {f"{vendor_param}=off": False, "iommu=off": False}
    if cpu_vendor == "intel":
        off_switches[f"{vendor_param}=on"] = True
    state = _last(configured, off_switches, (vendor_param, "iommu"))
    if iommu:
        if state and not state[0]:
            refusals.append(
                f"boot.iommu is true but {state[1]} (configured at {state[2]}) turns the IOMMU "
                f"off; remove it there (gpuhost does not remove parameters it did not write), or "
                "set boot.iommu: false"
            )
        elif cpu_vendor == "intel" and not state:
            wanted.append("intel_iommu=on")
    for param, origin in configured:
        name, value = _split(param)
        if name == "amd_iommu" and any(t not in AMD_IOMMU_OPTIONS for t in _tokens(value)):
            notes.append(
                f"{param} (configured at {origin}) is not an amd_iommu option the kernel knows "
                "(it logs 'AMD-Vi: Unknown option' and ignores it; the AMD IOMMU is on by "
                "default); gpuhost leaves it in place"
            )

    # --- identity domains (iommu=pt) and SEV-SNP -----------------------------------------
    keep_snp = snp_host and snp == "keep"
    if iommu_passthrough and keep_snp:
        refusals.append(
            "boot.iommu_passthrough is true but this host has SEV-SNP enabled, and iommu=pt turns "
            "SNP off at boot (the AMD IOMMU driver withdraws it); set boot.snp: give_up to trade "
            "SNP for identity domains, or leave boot.iommu_passthrough unset"
        )
    planned_pt = iommu and (iommu_passthrough if iommu_passthrough is not None else not keep_snp)
    user_pt = _last(configured, _PASSTHROUGH, ("iommu", "iommu.passthrough"))
    if planned_pt and not (iommu_passthrough and keep_snp):
        if user_pt and not user_pt[0]:
            refusals.append(
                f"identity domains (iommu=pt) are planned but {user_pt[1]} (configured at "
                f"{user_pt[2]}) keeps DMA translated; remove it there, or set "
                "boot.iommu_passthrough: false"
            )
        elif not user_pt:
            wanted.append("iommu=pt")
    elif not planned_pt and user_pt and user_pt[0]:
        why = (
            "SEV-SNP is kept (boot.snp: keep), and identity domains turn it off"
            if keep_snp
            else "boot.iommu_passthrough is false"
        )
        fix = "set boot.snp: give_up" if keep_snp else "set boot.iommu_passthrough: true"
        refusals.append(
            f"{user_pt[1]} (configured at {user_pt[2]}) gives host devices identity domains, but "
            f"{why}; remove it there, or {fix}"
        )
    identity = bool(planned_pt or (user_pt and user_pt[0]))
    if snp_host and snp == "give_up" and identity:
        notes.append(
            "SEV-SNP: iommu=pt turns SNP off at boot (the AMD IOMMU driver logs 'SNP: IOMMU "
            "disabled or configured in passthrough mode, SNP cannot be supported'); SEV-SNP "
            "guests cannot start on this host until iommu=pt is removed"
        )
    elif snp_host and keep_snp:
        notes.append(
            "SEV-SNP is enabled and kept: host-driver GPUs DMA through translated IOMMU domains "
            "(no iommu=pt), where GPU peer-to-peer is not relied on"
        )
    elif not snp_host and snp == "give_up":
        notes.append("boot.snp: give_up changes nothing: SEV-SNP is not enabled on this host")

    # --- the other managed parameters ---------------------------------------------------------
    others: list[str] = []
    if acs_override:
        others.append(f"pcie_acs_override={acs_override}")
    if pci_realloc:
        others.append("pci=realloc")
    others += list(extra)
    for param in others:
        name, _ = _split(param)
        same = [(p, o) for p, o in configured if _split(p)[0] == name]
        realloc = name == "pci" and _realloc(param) is True  # gpuhost's own pci= option
        if param in user or (realloc and any(_realloc(p) is True for p, _ in same)):
            continue  # the user's own copy already gives it
        # every pci= occurrence is parsed (drivers/pci/pci.c pci_setup, an early_param), its
        # options independent: only a realloc=off clashes with gpuhost's realloc
        clashing = [(p, o) for p, o in same if name != "pci" or (realloc and _realloc(p) is False)]
        clash = next(iter(clashing), None)
        if clash:
            refusals.append(
                f"{param} is planned but {clash[0]} is configured at {clash[1]}; gpuhost does not "
                "override parameters it did not write: remove it there, or plan the same value"
            )
        elif param not in wanted:
            wanted.append(param)

    # --- the running kernel -----------------------------------------------------------------
    if iommu and not iommu_active:
        notes.append(
            "the IOMMU is not active in the running kernel (no /sys/class/iommu entries, no "
            "IOMMU groups); it is expected after the next boot, and if it stays off, enable "
            f"{'VT-d' if cpu_vendor == 'intel' else 'AMD-Vi (IOMMU)'} in the firmware"
        )
    elif iommu and cpu_vendor == "intel" and "intel_iommu=on" in wanted:
        notes.append(
            "the IOMMU is already on in the running kernel (built with "
            "CONFIG_INTEL_IOMMU_DEFAULT_ON, as Proxmox's 6.8+ kernels are); gpuhost still "
            "writes intel_iommu=on so the next kernel does not depend on its build configuration"
        )
    kernel = list(running[: running.index("--")] if "--" in running else running)
    if identity and "iommu=pt" not in kernel and iommu_active:
        notes.append("identity domains (iommu=pt) take effect at the next boot")
    return IommuPlan(
        wanted=tuple(wanted),
        refusals=tuple(refusals),
        notes=tuple(notes),
        identity_domains=identity,
        iommu_active=iommu_active,
    )


def _realloc(param: str) -> bool | None:
    """pci= is a comma list of independent options: what it says about realloc, if anything."""
    tokens = _tokens(_split(param)[1])
    if "realloc=off" in tokens:
        return False
    return True if {"realloc", "realloc=on"} & set(tokens) else None
