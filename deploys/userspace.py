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
import shlex

from pyinfra import host
from pyinfra.api import FileUploadCommand, deploy, operation

from deploys.context import observed
from facts.driver_install import PERSISTENCED, PERSISTENCED_USER, DriverUserspace
from facts.nvidia import NvidiaUserspace
from gpuhost.plan import STATE_DIR, Plan
from gpuhost.userspaceplan import FABRICMANAGER_UNIT, INSTALLER_DIR
from gpuhost.userspaceplan import DriverUserspace as WantedUserspace

PENDING = f"{STATE_DIR}/pending-userspace"
INSTALLER_FLAGS = (
    "--silent --no-kernel-modules --no-kernel-module-source --no-nouveau-check --accept-license"
)


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


@operation()
def fabricmanager_installed(wanted: WantedUserspace):
    """
    Install nvidia-fabricmanager of ``wanted.version`` from its .deb and enable its service,
    unless that version is installed.

    + wanted: the Plan's userspace (its fabricmanager: the .deb on the control machine)
    """
    assert wanted.fabricmanager is not None
    now = host.get_fact(DriverUserspace).fabric
    if now.version == wanted.version:
        host.noop(f"nvidia-fabricmanager {wanted.version} is installed")
        return
    q = shlex.quote
    remote = f"{INSTALLER_DIR}/{posixpath.basename(wanted.fabricmanager)}"
    yield f"mkdir -p {q(INSTALLER_DIR)}"
    yield FileUploadCommand(wanted.fabricmanager, remote)
    yield (
        f"dpkg -i {q(remote)} && v=$(dpkg-query -W -f '${{Version}}' 'nvidia-fabricmanager*') && "
        f'case "$v" in {q(wanted.version)}-*) ;; *) echo "gpuhost: nvidia-fabricmanager is '
        f'$v after dpkg -i, wanted {wanted.version}" >&2; exit 1;; esac && '
        f"systemctl enable {FABRICMANAGER_UNIT} && rm -f {q(remote)}"
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
        fabricmanager_installed(
            name=f"nvidia-fabricmanager {wanted.version} ({len(wanted.nvswitches)} NVSwitches)",
            wanted=wanted,
        )
