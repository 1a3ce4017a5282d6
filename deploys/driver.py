"""NVIDIA kernel modules for the Plan's kernel: from the artifact store, else built and stored.

Order of preference: modules already in the store (no compiler runs anywhere, as when a host is
reprovisioned); a build on the control machine when it has the kernel's headers and a GCC of the
kernel's version; a build on the host with the host's matching GCC. When neither machine has that
compiler the run stops while pyinfra prepares it, before any operation changes the host, with a
message naming the kernel's compiler and the host's.

Installed modules go to /lib/modules/<kernel>/updates/gpuhost/ and are compared by sha256 with
the store's manifest (one fact), so a converged run changes nothing. Before an install counts as
done, ``modinfo -k <kernel>`` must show the kernel's release in the nvidia module's vermagic.

The userspace, GSP firmware, persistence daemon and fabric manager: deploys/userspace.py.
"""

from __future__ import annotations

import atexit
import shlex
import shutil
import tempfile
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import DeployError, FileUploadCommand, OperationError, deploy, operation
from pyinfra.operations import python

from deploys.context import observed
from facts.driver_install import BuildResources, ModuleHashes
from gpuhost.build.artifacts import ArtifactError, ArtifactStore
from gpuhost.build.driver import build_command, inspect_module
from gpuhost.build.driverstore import (
    MODULE_FILES,
    DriverModulesError,
    build_on_control,
    check_built,
    check_stored,
    check_tree,
    modules_key,
    source_tarball,
    store_built,
)
from gpuhost.observe.driver_install import PENDING
from gpuhost.paths import STATE_DIR
from gpuhost.plan.driver.modules import MODULES_KIND, DriverModules, for_new_kernel
from gpuhost.plan.driver.toolchain import build_jobs
from gpuhost.plan.make import Plan

BUILD_DIR = f"{STATE_DIR}/driver-build"


def _scratch() -> Path:
    """A control-machine directory for this run's tarballs and downloads, removed at exit."""
    path = Path(tempfile.mkdtemp(prefix="gpuhost-driver-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _local_resources() -> tuple[int, int]:
    import os

    meminfo = Path("/proc/meminfo").read_text()
    kib = next(int(line.split()[1]) for line in meminfo.splitlines() if "MemAvailable" in line)
    return os.cpu_count() or 1, kib * 1024


@operation()
def modules_installed(
    wanted: DriverModules,
    files: dict[str, str] | None,
    local_dir: str | None = None,
    remote_dir: str | None = None,
):
    """
    Install the NVIDIA modules into /lib/modules/<kernel>/updates/gpuhost, run depmod, and check
    the installed nvidia module's vermagic.

    + wanted: the Plan's modules (kernel, driver version)
    + files: the store's file name -> sha256; None when the modules were just built on the host
    + local_dir: the stored artifact's directory on the control machine (uploaded)
    + remote_dir: the host's build output (copied), for a build on the host

    Each module is written under a temporary directory beside the target and renamed into it;
    a pending mark stays until depmod and the vermagic check passed, so a run killed halfway
    installs again next time.
    """
    target = wanted.install_dir
    now = host.get_fact(ModuleHashes, directory=target)
    if files is not None and now == files:
        host.noop(f"NVIDIA {wanted.version} modules for {wanted.kernel} are installed as stored")
        return
    q = shlex.quote
    staging = f"{target}.gpuhost-new"
    yield f"rm -rf {q(staging)} && mkdir -p {q(staging)} {q(target)} && touch {q(target)}/{PENDING}"
    if local_dir is not None:
        for name in sorted(files or {}):
            yield FileUploadCommand(str(Path(local_dir) / name), f"{staging}/{name}")
    else:
        assert remote_dir is not None
        sources = " ".join(q(f"{remote_dir}/{name}") for name in MODULE_FILES)
        yield f"cp {sources} {q(staging)}/"
    keep = "|".join(MODULE_FILES)
    release = wanted.kernel
    yield (
        f"chmod 0644 {q(staging)}/*.ko && for f in {q(staging)}/*.ko; do "
        f'mv -f "$f" {q(target)}/; done && rmdir {q(staging)} && '
        f'for f in {q(target)}/*.ko; do case "${{f##*/}}" in {keep}) ;; *) rm -f "$f";; esac; '
        f"done && depmod -a {q(release)} && v=$(modinfo -k {q(release)} -F vermagic nvidia) && "
        f'case "$v" in {q(release)}" "*) ;; *) echo "gpuhost: the nvidia module for '
        f"{release} has vermagic '$v', not {release}: it must not be booted; rebuild it\" >&2; "
        f"exit 1;; esac && rm -f {q(target)}/{PENDING}"
    )


@operation()
def modules_built_on_host(wanted: DriverModules, cc: str, jobs: int, tarball: str, workdir: str):
    """
    Build the modules on the host from the uploaded source tree with compiler ``cc``, against
    the kernel's headers (/lib/modules/<kernel>/build), into ``workdir``/out.

    + cc: the host's compiler of the kernel's GCC version (gpuhost.plan.driver.toolchain)
    + jobs: parallel jobs (from the host's cores and available memory)
    + tarball: the source tree as a tar on the control machine
    """
    q = shlex.quote
    yield f"rm -rf {q(workdir)} && mkdir -p {q(workdir)}/out"
    yield FileUploadCommand(tarball, f"{workdir}/src.tar")
    make = build_command(f"{workdir}/src", f"/lib/modules/{wanted.kernel}/build", cc, jobs)
    built = " ".join(q(f"{workdir}/src/kernel-open/{name}") for name in MODULE_FILES)
    yield f"tar -xf {q(workdir)}/src.tar -C {q(workdir)} && {make} && cp {built} {q(workdir)}/out/"


def _store_from_host(wanted: DriverModules, workdir: str, scratch: str, cc: str) -> None:
    """Fetch the host's build, check it like any build, and keep it in the store."""
    key = modules_key(wanted)
    assert key is not None
    local = Path(scratch) / "from-host"
    local.mkdir(parents=True, exist_ok=True)
    for name in MODULE_FILES:
        if not host.get_file(f"{workdir}/out/{name}", str(local / name)):
            raise OperationError(f"could not download {workdir}/out/{name}")
    modules = [inspect_module(local / name) for name in MODULE_FILES]
    try:
        check_built(modules, wanted)
    except DriverModulesError as exc:
        raise OperationError(str(exc)) from None
    store_built(ArtifactStore(wanted.store), key, modules, host.name, cc)


@deploy("NVIDIA kernel modules")
def configure(plan: Plan, new_kernel_compiler: str | None = None) -> None:
    """+ new_kernel_compiler: the compiler of the kernel this run installs from the store (the
    host has no config for it yet), from the stored build"""
    wanted = plan.driver_modules
    if wanted is None:
        return  # driver.source unset: the modules are not gpuhost's to manage on this host
    if modules_key(wanted) is None:
        # The kernel is installed by this run: its compiler is the stored kernel's, or (a
        # Proxmox package) the one the store's only build of these modules for it names.
        stored = ArtifactStore(wanted.store).keys(MODULES_KIND, wanted.version, wanted.kernel)
        if new_kernel_compiler is None and len(stored) == 1:
            new_kernel_compiler = stored[0].compiler
        if new_kernel_compiler:
            available = observed(host).compilers.compilers
            wanted = for_new_kernel(wanted, new_kernel_compiler, available)
    where = f"{host.name}: NVIDIA modules for kernel {wanted.kernel}"
    key = modules_key(wanted)
    if key is None:
        raise DeployError(
            f"{where}: the host has no config for that kernel (/boot/config-{wanted.kernel} or "
            f"/lib/modules/{wanted.kernel}/build/.config) to tell its compiler; install the "
            "kernel and its headers first, or keep one build of these modules for it in the store"
        )
    store = ArtifactStore(wanted.store)
    scratch = _scratch()
    try:
        artifact = store.get(key) or build_on_control(
            wanted, store, scratch / "control-build", *_local_resources()
        )
        if artifact is not None:
            check_stored(artifact, wanted)
    except (ArtifactError, DriverModulesError) as exc:
        raise DeployError(f"{where}: {exc}") from None
    if artifact is not None:
        modules_installed(
            name=f"NVIDIA {wanted.version} modules for {wanted.kernel} (from the store)",
            wanted=wanted,
            files=artifact.files,
            local_dir=str(artifact.directory),
        )
        return
    choice = wanted.on_host
    assert choice is not None
    if choice.command is None:
        # Refused here, while pyinfra prepares: nothing has been uploaded or changed yet.
        raise DeployError(f"{where}: nothing stored under {key.path}, and {choice.refusal}")
    try:
        check_tree(wanted)
    except DriverModulesError as exc:
        raise DeployError(f"{where}: {exc}") from None
    cores, available = host.get_fact(BuildResources)
    jobs = build_jobs(cores, available, "c")
    logger.info(f"{where}: building on the host with {choice.compiler_text} (-j{jobs})")
    workdir = f"{BUILD_DIR}/{wanted.version}-{wanted.kernel}"
    tarball = source_tarball(wanted.tree, scratch / "src.tar")
    modules_built_on_host(
        name=f"Build NVIDIA {wanted.version} modules for {wanted.kernel} with {choice.command}",
        wanted=wanted,
        cc=choice.command,
        jobs=jobs,
        tarball=str(tarball),
        workdir=workdir,
    )
    python.call(
        name=f"Keep the built modules in the store ({wanted.store})",
        function=_store_from_host,
        wanted=wanted,
        workdir=workdir,
        scratch=str(scratch),
        cc=choice.compiler_text or choice.command,
    )
    modules_installed(
        name=f"NVIDIA {wanted.version} modules for {wanted.kernel} (built on the host)",
        wanted=wanted,
        files=None,
        remote_dir=f"{workdir}/out",
    )
