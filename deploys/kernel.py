"""The spec's kernel, installed beside the running one: a Proxmox package by release (apt, from
the host's own sources), or the .debs `gpuhost build` left in the artifact store (dpkg only: a
reprovisioned host compiles nothing). The store is a directory on the control machine, or the
one on the build host that artifacts.build_host names (gpuhost/build/remotestore.py).

A kernel that lacks what the host needs from Proxmox's packaging (zfs.ko where ZFS is used, the
ACS patch for boot.acs_override) is refused before anything changes: a stored package is read
here on the control machine, an installed kernel from the host's facts.

Installing never makes the new kernel boot: deploys/trial_boot.py pinned the running kernel
first, and only the trial boot starts the new one, once. Whether the kernel is installed comes
from the host (its /boot/config-<release>, read with the other facts in one command), so a
converged run changes nothing and a run killed during dpkg installs again on the next.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import DeployError, FileUploadCommand, operation
from pyinfra.facts.apt import noninteractive_apt

from deploys.context import observed
from gpuhost.build.artifacts import ArtifactError
from gpuhost.build.debinfo import DebError
from gpuhost.build.features import feature_problems, package_features
from gpuhost.build.host import BuildHostError
from gpuhost.build.kernelstore import (
    KernelInstall,
    KernelStoreError,
    installed_problem,
    plan_install,
)
from gpuhost.build.remotestore import store_for
from gpuhost.observe.zfs import KernelFeatures
from gpuhost.paths import STATE_DIR
from gpuhost.plan.make import Plan
from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import SOURCE_KEY, SPEC_KEY

DEB_DIR = f"{STATE_DIR}/kernel-debs"


def is_installed(plan: Plan) -> bool:
    """The kernel image package put /boot/config-<release> there (Debian and Proxmox both)."""
    return "boot" in observed(host).compilers.kernels.get(plan.target_kernel, {})


def install_plan(plan: Plan) -> KernelInstall | None:
    """How this run installs the spec's kernel; None when it is installed. Refuses (before
    anything changes) an installed kernel built by another GCC, a store without the build, and
    a kernel without what this host needs from Proxmox's packaging (zfs.ko on a host that uses
    ZFS, the ACS patch for boot.acs_override: gpuhost/build/features.py)."""
    spec: HostSpec = host.data.get(SPEC_KEY)
    release, gcc = plan.target_kernel, spec.toolchain.gcc
    where = f"{host.name}: kernel {release}"
    if release == plan.running_kernel:
        return None  # running (its config may only be in /proc/config.gz)
    facts = observed(host)
    if is_installed(plan):
        problem = installed_problem(release, facts.compilers.kernel_compiler(release), gcc)
        if problem:
            raise DeployError(f"{host.name}: {problem}")
        features = facts.kernel_features.kernels.get(release)
        if features is not None:
            _refuse_missing(release, features, "its files on the host")
        return None
    try:
        # The control machine's store, or the build host's (fetched into the mirror, verified)
        store = (
            store_for(spec.artifacts, host.data.get(SOURCE_KEY))
            if spec.kernel.source == "build"
            else None
        )
        install = plan_install(release, spec.kernel.source, gcc, store)
        if install.source == "build":  # apt's proxmox-kernel packages are Proxmox's own build
            image = install.debs[0]  # the image package comes first (kernelstore._debs)
            _refuse_missing(release, package_features(image, release), Path(image).name)
        return install
    except (KernelStoreError, ArtifactError, BuildHostError, DebError) as exc:
        raise DeployError(f"{where}: {exc}") from None


def _refuse_missing(release: str, features: KernelFeatures, where: str) -> None:
    spec: HostSpec = host.data.get(SPEC_KEY)
    facts = observed(host)
    problems = feature_problems(
        release, features, facts.zfs.reason(facts.cmdline), spec.boot.acs_override, where
    )
    if problems:
        raise DeployError(f"{host.name}: " + "\n".join(problems))


@operation()
def installed(install: KernelInstall | None):
    """
    Install the kernel's packages: apt for a Proxmox release, else upload the stored .debs and
    dpkg -i them (the packages' hooks build the initramfs and sync the ESPs).

    + install: from :func:`install_plan`; None: installed already
    """
    if install is None:
        host.noop("the kernel is installed")
        return
    if install.source == "package":
        yield noninteractive_apt("install " + " ".join(map(shlex.quote, install.packages)))
        return
    q = shlex.quote
    yield f"rm -rf {q(DEB_DIR)} && mkdir -p {q(DEB_DIR)}"
    remote = [f"{DEB_DIR}/{Path(deb).name}" for deb in install.debs]
    for deb, dest in zip(install.debs, remote, strict=True):
        yield FileUploadCommand(deb, dest)
    yield (
        "DEBIAN_FRONTEND=noninteractive dpkg --force-confdef --force-confold -i "
        + " ".join(map(q, remote))
        + f" && rm -rf {q(DEB_DIR)}"
    )


def keep_problem(plan: Plan) -> str | None:
    """kernel.keep names kernels that must stay bootable: each must be installed."""
    spec: HostSpec = host.data.get(SPEC_KEY)
    kernels = observed(host).compilers.kernels
    missing = [
        k for k in spec.kernel.keep if k != plan.running_kernel and "boot" not in kernels.get(k, {})
    ]
    if not missing:
        return None
    return (
        f"kernel.keep names {', '.join(missing)}, not installed on the host (no /boot/config-"
        f"{missing[0]}): a known-good kernel must be installed to be kept. Install it, or drop "
        "it from kernel.keep"
    )


@operation()
def kept(keep: list[str]):
    """
    Keep the known-good kernels in proxmox-boot-tool's manual list: the ESPs' automatic choice
    (newest two, the running one and the pins) would drop them after a few kernel updates.

    + keep: kernel.keep
    """
    kernels = observed(host).boot_kernels
    if kernels is None:
        host.noop("proxmox-boot-tool is not installed: no ESP kernel list to keep them in")
        return
    missing = [k for k in keep if k not in kernels.manual]
    if not missing:
        host.noop(f"kept: {', '.join(keep) or 'none asked'}")
        return
    for k in missing:
        yield f"proxmox-boot-tool kernel add {shlex.quote(k)}"
    yield "proxmox-boot-tool refresh"


def configure(plan: Plan) -> KernelInstall | None:
    """Install the spec's kernel unless it is installed; returns how (None: nothing to do).
    Keep the known-good kernels of kernel.keep on every ESP."""
    problem = keep_problem(plan)
    if problem:
        raise DeployError(f"{host.name}: {problem}")
    spec: HostSpec = host.data.get(SPEC_KEY)
    kept(name="Known-good kernels stay on the ESPs (kernel.keep)", keep=list(spec.kernel.keep))
    install = install_plan(plan)
    installed(
        name=f"Kernel {plan.target_kernel}"
        + (f" ({install.describe()})" if install is not None else ""),
        install=install,
    )
    return install
