"""What a Proxmox VE 8 -> 9 upgrade changed for gpuhost, from the host's facts alone.

The distribution upgrade (apt sources to trixie, `apt dist-upgrade`, reboot; Proxmox wiki
"Upgrade from 8 to 9", pve-manager PVE/CLI/pve8to9.pm) is the operator's, not gpuhost's. What it
leaves behind is what gpuhost must see:
  - a new kernel series (proxmox-kernel-6.14 of PVE 9, built by Debian 13's GCC 14) beside the
    previous release's kernels, which stay installed (pve8to9 suggests removing their
    meta-packages by hand) and may stay pinned (a proxmox-boot-tool pin survives the upgrade);
  - a new compiler: the previous kernels' GCC (Debian 12's 12.2.0) is gone, so no module can
    be built for them on the host any more;
  - no NVIDIA module for the new kernel: gpuhost's modules are built per kernel, not by DKMS
    (pve8to9 `check_dkms_modules` warns that out-of-tree modules need care);
  - pve-container 6 (a new devN is hot-plugged into a running container) while the containers
    keep their own userspace: their NVIDIA libraries must still equal the host driver.

A kernel "of the previous release" is one whose compiler (its CONFIG_CC_VERSION_TEXT) no compiler
on the host matches, on a host whose pve-manager says Proxmox VE 9 or later.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.driver.toolchain import ToolchainError, choose_module_compiler, parse_compiler
from gpuhost.plan.reasons import kernel_version_key  # proxmox-boot-tool's order
from gpuhost.spec.host import HostSpec

GUIDE = "docs/guides/upgrade-pve9.md"


@dataclass(frozen=True)
class ReleaseChange:
    """An upgraded host: the release it runs and its kernels on each side of the upgrade."""

    release: str  # "Proxmox VE 9.0.10 on Debian 13 (trixie)"
    previous: dict[str, str]  # kernel -> compiler version, kernels no host compiler can serve
    current: dict[str, str]  # kernel -> compiler version, kernels the host's compilers serve
    compilers: dict[str, str]  # the host's compilers: command -> version
    running: str
    container_tooling: str | None  # pve-container version

    @property
    def newest(self) -> str | None:
        return max(self.current, key=kernel_version_key) if self.current else None


def _version(text: str) -> str | None:
    try:
        return parse_compiler(text).version
    except ToolchainError:
        return None


def release_change(facts: HostFacts) -> ReleaseChange | None:
    """None unless the host runs Proxmox VE 9 or later with kernels of an earlier release."""
    major = facts.release.pve_major
    if major is None or major < 9 or not facts.compilers.compilers:
        return None
    previous, current = {}, {}
    for kernel, sources in sorted(
        facts.compilers.kernels.items(), key=lambda k: kernel_version_key(k[0])
    ):
        if not {"boot", "proc"} & set(sources):
            continue  # headers without a kernel (a Debian linux-headers package alone)
        cc = facts.compilers.kernel_compiler(kernel)
        version = _version(cc) if cc else None
        if version is None:
            continue  # a kernel whose compiler gpuhost cannot name: neither side
        served = choose_module_compiler(cc, facts.compilers.compilers).command is not None
        (current if served else previous)[kernel] = version
    if not previous:
        return None
    compilers = {c: v for c, line in facts.compilers.compilers.items() if (v := _version(line))}
    tooling = facts.pve_container.version if facts.pve_container else None
    return ReleaseChange(
        facts.release.describe(), previous, current, compilers, facts.kernel.release, tooling
    )


def plan_release_change(
    spec: HostSpec, facts: HostFacts, problems: list[str], notes: list[str]
) -> ReleaseChange | None:
    """The upgrade's notes, and a problem for each spec field still of the previous release."""
    change = release_change(facts)
    if change is None:
        return None
    have = ", ".join(f"{c} {v}" for c, v in sorted(change.compilers.items())) or "none"
    fix = (
        f"set kernel.version: {change.newest} (installed, built by gcc {change.current[change.newest]})"
        f" and toolchain.gcc: {change.current[change.newest]}"
        if change.newest
        else "install the new release's kernel (proxmox-kernel-6.14) and set kernel.version to it"
    )
    kernel = spec.kernel.version
    if kernel in change.previous:
        problems.append(
            f"kernel.version {kernel} is a kernel of the release before the upgrade: built by gcc "
            f"{change.previous[kernel]}, which this host ({change.release}; compilers: {have}) no "
            f"longer has, so no NVIDIA module can be built for it here; {fix} ({GUIDE})"
        )
    gcc = spec.toolchain.gcc
    if gcc in change.previous.values() and gcc not in change.compilers.values():
        problems.append(
            f"toolchain.gcc {gcc} is the compiler of the release before the upgrade; this host "
            f"({change.release}) has {have}; {fix} ({GUIDE})"
        )
    olds = ", ".join(f"{k} (gcc {v})" for k, v in change.previous.items())
    news = ", ".join(f"{k} (gcc {v})" for k, v in change.current.items()) or "none installed"
    notes.append(
        f"upgraded host: {change.release}; kernels of the new series: {news}; kernels of the "
        f"previous release, kept installed but no longer buildable here: {olds}"
    )
    if change.running in change.previous:
        notes.append(
            f"the running kernel {change.running} is from before the upgrade (a kernel pin "
            "survives it): the deploy trial-boots kernel.version and pins it once it passed"
        )
    if kernel in change.current:
        notes.append(
            f"the NVIDIA {spec.driver.version} modules must be built for {kernel} with gcc "
            f"{change.current[kernel]} (the modules of the previous kernels do not load into it)"
        )
    if spec.lxc_guests:
        notes.append(
            f"pve-container {change.container_tooling or '?'}: the GPU containers keep their own "
            f"userspace across the host upgrade; their NVIDIA libraries must still equal the host "
            f"driver {spec.driver.version} (the guest deploy brings them along)"
        )
    return change
