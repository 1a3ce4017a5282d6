"""The Plan's NVIDIA userspace: the installer (and fabric manager package) on the control
machine, the version the host must show afterwards, and the persistence daemon's boot unit.
Pure: from the spec and the host's facts."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.observe.pci import nvswitches
from gpuhost.paths import STATE_DIR
from gpuhost.spec.host import HostSpec

# Where the installer is uploaded and run; removed once the install is verified.
INSTALLER_DIR = f"{STATE_DIR}/driver-installer"
PERSISTENCED_UNIT = "/etc/systemd/system/gpuhost-nvidia-persistenced.service"
PERSISTENCED_WANTS = (
    "/etc/systemd/system/multi-user.target.wants/gpuhost-nvidia-persistenced.service"
)
FABRICMANAGER_UNIT = "nvidia-fabricmanager.service"  # shipped by NVIDIA's package
# nvidia-installer's flags for a userspace-only install (deploys/userspace.py says why each)
INSTALLER_FLAGS = (
    "--silent --no-kernel-modules --no-kernel-module-source --no-nouveau-check --accept-license"
)


def installer_name(version: str) -> str:
    """NVIDIA's installer of driver ``version``, as NVIDIA names it."""
    return f"NVIDIA-Linux-x86_64-{version}.run"


@dataclass(frozen=True)
class DriverUserspace:
    version: str  # driver.version: libraries and firmware must carry exactly this
    installer: str  # NVIDIA-Linux-x86_64-<version>.run on the control machine
    fabricmanager: str | None  # the .deb on the control machine; None: no NVSwitch here
    nvswitches: tuple[str, ...]  # BDFs of the NVSwitches that need the fabric manager

    @property
    def remote_installer(self) -> str:
        return f"{INSTALLER_DIR}/{posixpath.basename(self.installer)}"

    @property
    def firmware_dir(self) -> str:
        return f"/lib/firmware/nvidia/{self.version}"


def plan_driver_userspace(
    spec: HostSpec, facts: HostFacts, problems: list[str]
) -> DriverUserspace | None:
    """None when the spec leaves the userspace unmanaged (no driver.source.installer). A host
    with NVSwitches needs the fabric manager package too: its absence is a plan problem."""
    source = spec.driver.source
    if source is None or source.installer is None:
        return None
    switches = tuple(nvswitches(facts.pci))
    if switches and source.fabricmanager is None:
        problems.append(
            f"driver.source.fabricmanager: required on this host, which has NVSwitches "
            f"({', '.join(switches)}): CUDA does not start on them without nvidia-fabricmanager; "
            f"give the path of the nvidia-fabricmanager .deb of {spec.driver.version}"
        )
    return DriverUserspace(
        spec.driver.version,
        source.installer,
        source.fabricmanager if switches else None,
        switches,
    )


def persistenced_unit(wanted: DriverUserspace | None) -> str | None:
    """The daemon's unit, after NVIDIA's sample (nvidia-persistenced's
    init/systemd/nvidia-persistenced.service.template: forking, --user, its runtime directory
    removed after it stops), plus the daemon's own pid file (NVPD_PID_FILE,
    nvidia-persistenced.c) as PIDFile=, so a restart stops exactly that daemon (deploys/rebind.py
    restarts it when it does not know a GPU); the .run installs the binary but no unit. None:
    not managed."""
    if wanted is None:
        return None
    return (
        "# Managed by gpuhost (NVIDIA persistence daemon); edit the inventory, not this file.\n"
        "[Unit]\n"
        f"Description=NVIDIA Persistence Daemon (driver {wanted.version})\n"
        "After=systemd-modules-load.service gpuhost-nvidia-devices.service\n"
        "Before=pve-guests.service\n"
        "\n"
        "[Service]\n"
        "Type=forking\n"
        "PIDFile=/run/nvidia-persistenced/nvidia-persistenced.pid\n"
        "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced\n"
        "ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )
