"""The NVIDIA driver's userspace and GSP firmware, from NVIDIA's installer; the fabric manager
on NVSwitch boards. Only where the spec sets driver.source.installer.

The installer (`NVIDIA-Linux-x86_64-<version>.run`) is uploaded and run only when the host does
not show exactly that version: libcuda and libnvidia-ml as the loader resolves them, the GSP
firmware in /lib/firmware/nvidia/<version>/, /usr/bin/nvidia-persistenced. It runs with
--no-kernel-modules: the modules are gpuhost's own build (deploys/driver.py). Its flags are
nvidia-installer's (option_table.h in NVIDIA/nvidia-installer): --silent (no questions, no
ncurses UI), --no-kernel-modules (the current name; --no-kernel-module is an alias),
--no-kernel-module-source (no module source tree in /usr/src either),
--no-nouveau-check (nouveau may still be loaded before the reboot that gpuhost's blacklist
takes effect in), --accept-license (obsolete and ignored by current installers, required by old
ones). A no-kernel-modules run still installs the manifest's FIRMWARE entries into
/lib/firmware/nvidia/<version>/ (only --kernel-module-only drops non-module files), so the
firmware comes from the same run, and is verified like the libraries.

A pending mark is written before the installer runs and removed only when the host shows the
wanted version afterwards: a run killed in between installs again.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path

from pyinfra import host
from pyinfra.api import FileUploadCommand, deploy, operation
from pyinfra.api.exceptions import DeployError

from deploys.context import observed
from facts.driver_install import DriverUserspace
from gpuhost.build.debinfo import DebError, control_fields
from gpuhost.observe.driver_install import PERSISTENCED, PERSISTENCED_USER
from gpuhost.observe.nvidia_driver import FABRICMANAGER_QUERY, NvidiaUserspace
from gpuhost.paths import STATE_DIR
from gpuhost.plan.driver.userspace import FABRICMANAGER_UNIT, INSTALLER_DIR, INSTALLER_FLAGS
from gpuhost.plan.driver.userspace import DriverUserspace as WantedUserspace
from gpuhost.plan.make import Plan

PENDING = f"{STATE_DIR}/pending-userspace"
FABRICMANAGER_PACKAGE = re.compile(r"nvidia-fabricmanager(-[0-9]+)?")


def _verify(wanted: WantedUserspace) -> str:
    """Shell that fails, naming what it found, unless the host shows the version exactly."""
    q, version, firmware = shlex.quote, wanted.version, wanted.firmware_dir
    libs = NvidiaUserspace().command()
    return (
        f"found=$( {{ {libs}; }} | sed -n 's#^/.*/\\(lib[a-z-]*\\)\\.so\\.\\([0-9.]*\\)$#\\1 \\2#p' "
        "| sort -u | tr '\\n' ' ') && "
        f'want="libcuda {version} libnvidia-ml {version} " && '
        f'if [ "$found" != "$want" ]; then echo "gpuhost: after the installer the host shows '
        f"userspace '${{found% }}', wanted driver {version} (libcuda and libnvidia-ml of "
        f'exactly driver.version)" >&2; exit 1; fi && '
        f"ls {q(firmware)}/gsp_*.bin >/dev/null 2>&1 || {{ echo "
        f'"gpuhost: no GSP firmware in {firmware}/ after the installer" '
        ">&2; exit 1; } && "
        f'[ -x {PERSISTENCED} ] || {{ echo "gpuhost: the installer left no {PERSISTENCED}" >&2; '
        "exit 1; }"
    )


@operation()
def userspace_installed(wanted: WantedUserspace):
    """
    Install the userspace and GSP firmware of ``wanted.version`` with NVIDIA's installer,
    without kernel modules, unless the host shows exactly that version; then verify it.

    + wanted: the Plan's userspace (version, installer on the control machine)
    """
    now = host.get_fact(DriverUserspace)
    files = observed(host).files or {}
    if now.installed(wanted.version) and PENDING not in files:
        host.noop(f"NVIDIA {wanted.version} userspace and GSP firmware are installed")
    else:
        q = shlex.quote
        remote = wanted.remote_installer
        yield f"mkdir -p {q(STATE_DIR)} {q(INSTALLER_DIR)} && touch {q(PENDING)}"
        yield FileUploadCommand(wanted.installer, remote)
        yield (
            f"sh {q(remote)} {INSTALLER_FLAGS} && {_verify(wanted)} && "
            f"rm -f {q(remote)} {q(PENDING)}"
        )
    if not now.persistenced_user:
        # The user NVIDIA's sample unit runs the daemon as (init/install.sh makes it too).
        yield (
            f"getent passwd {PERSISTENCED_USER} >/dev/null || useradd --system --no-create-home "
            f"--home-dir / --shell /usr/sbin/nologin --comment 'NVIDIA Persistence Daemon' "
            f"{PERSISTENCED_USER}"
        )


def _fabricmanager_install(deb: str, version: str) -> str:
    """Shell that installs the uploaded package ``deb`` only when its own control fields say
    it is NVIDIA's fabric manager of ``version`` (a file name can lie), then checks dpkg's
    record of it; a refused package is removed and nothing is installed."""
    q = shlex.quote
    refuse = (
        f'echo "gpuhost: {posixpath.basename(deb)} is $pkg $ver, wanted nvidia-fabricmanager '
        f'{version} (the package of driver.version); nothing was installed" >&2; '
        f"rm -f {q(deb)}; exit 1"
    )
    return (
        f"pkg=$(dpkg-deb -f {q(deb)} Package) && ver=$(dpkg-deb -f {q(deb)} Version) && "
        f'case "$pkg/$ver" in nvidia-fabricmanager/{version}-*|'
        f"nvidia-fabricmanager-[0-9]*/{version}-*) ;; *) {refuse};; esac && "
        f"dpkg -i {q(deb)} && v=$({FABRICMANAGER_QUERY}) && "
        f'case "$v" in {version}-*) ;; *) echo "gpuhost: nvidia-fabricmanager is '
        f"'$v' after dpkg -i, wanted {version}\" >&2; exit 1;; esac && rm -f {q(deb)}"
    )


@operation()
def fabricmanager_installed(wanted: WantedUserspace):
    """
    Install nvidia-fabricmanager of ``wanted.version`` from its .deb (refused, before dpkg
    runs, when the package is another version) and enable its service; start it now where the
    driver of that version is already loaded (else the next boot starts it).

    + wanted: the Plan's userspace (its fabricmanager: the .deb on the control machine)
    """
    assert wanted.fabricmanager is not None
    now = host.get_fact(DriverUserspace).fabric
    if now.version == wanted.version and now.enabled == "enabled":
        host.noop(f"nvidia-fabricmanager {wanted.version} is installed and enabled")
        return
    q = shlex.quote
    if now.version != wanted.version:
        remote = f"{INSTALLER_DIR}/{posixpath.basename(wanted.fabricmanager)}"
        yield f"mkdir -p {q(INSTALLER_DIR)}"
        yield FileUploadCommand(wanted.fabricmanager, remote)
        yield _fabricmanager_install(remote, wanted.version)
    # Started now only on the driver it must match; a host still on another driver (or none)
    # starts it at the boot that loads this one.
    yield (
        f"systemctl enable {FABRICMANAGER_UNIT} && "
        f"if grep -qsF ' {wanted.version} ' /proc/driver/nvidia/version; then "
        f"systemctl restart {FABRICMANAGER_UNIT}; fi"
    )


def _check_fabricmanager_package(wanted: WantedUserspace) -> None:
    """Stop the run while it prepares, before anything changes, unless the package's own
    control fields (not only its file name) say it is the fabric manager of the driver."""
    assert wanted.fabricmanager is not None
    try:
        fields = control_fields(Path(wanted.fabricmanager))
    except (OSError, DebError) as exc:
        raise DeployError(f"{host.name}: driver.source.fabricmanager: {exc}") from None
    package, version = fields.get("Package", ""), fields.get("Version", "")
    if not FABRICMANAGER_PACKAGE.fullmatch(package) or version.split("-")[0] != wanted.version:
        raise DeployError(
            f"{host.name}: driver.source.fabricmanager = {wanted.fabricmanager!r}: the package "
            f"inside is {package or '?'} {version or '?'}, but driver.version is "
            f"{wanted.version}; use the nvidia-fabricmanager package of {wanted.version} "
            "(nothing was changed)"
        )


@deploy("NVIDIA driver userspace")
def configure(plan: Plan) -> None:
    wanted = plan.driver_userspace
    if wanted is None:
        return  # no driver.source.installer: the userspace is not gpuhost's to manage here
    userspace_installed(
        name=f"NVIDIA {wanted.version} userspace and GSP firmware (no kernel modules)",
        wanted=wanted,
    )
    if wanted.fabricmanager is not None:
        _check_fabricmanager_package(wanted)
        fabricmanager_installed(
            name=f"nvidia-fabricmanager {wanted.version} ({len(wanted.nvswitches)} NVSwitches)",
            wanted=wanted,
        )
