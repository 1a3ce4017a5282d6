"""All facts the planner reads, in one place: parsed from one combined read or from a snapshot.

A snapshot is a directory with, per fact key, ``<key>.cmd`` (the exact command), ``<key>.out``
(its raw stdout) and ``<key>.rc`` (exit status; 127 when the fact's required tool is absent).
Snapshots come from :func:`capture_script` run on a host (or the ``gpuhost capture`` command),
and are parsed by the very parsers the pyinfra facts use, so a plan from a snapshot is the plan
the live host would get.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuhost.observe.boot import BootPath, BootPathInfo
from gpuhost.observe.compilers import CompilerInventory, KernelCompilers
from gpuhost.observe.containers import PackageVersion, PveContainerVersion
from gpuhost.observe.files import BootId, ConfigFiles, ManagedFiles, ModuleConfigFiles
from gpuhost.observe.guest_status import GuestStatuses
from gpuhost.observe.kernel import (
    CharDevices,
    CpuVendor,
    KernelBuild,
    KernelBuildInfo,
    KernelCmdline,
    LoadedModules,
    ModuleParameters,
    PanicSettings,
    SevSnp,
    SevState,
)
from gpuhost.observe.monitoring import MonitoringState, MonitoringStateFact
from gpuhost.observe.nvidia import GpuQuery, NvidiaGpus, NvidiaP2P, NvidiaTopology, Topology
from gpuhost.observe.nvidia_driver import DriverVersion, NvidiaDriver, NvidiaGpuInformation
from gpuhost.observe.pci import IommuDomains, IommuGroups, IommuState, PciDevice, PciDevices
from gpuhost.observe.probe import Probe
from gpuhost.observe.proxmox import (
    BootKernelList,
    BootKernels,
    BootTool,
    BootToolStatus,
    GuestConfig,
    PveGuestConfigs,
)
from gpuhost.observe.release import HostRelease, HostReleaseFact
from gpuhost.observe.snapshot import MISSING_TOOL, Commands
from gpuhost.observe.zfs import InstalledKernelFeatures, KernelFeatureFiles, ZfsUsage, ZfsUse

# key -> (fact class, fact arguments). The key names the snapshot files.
FACTS: dict[str, tuple[type[Probe], dict[str, Any]]] = {
    "PciDevices": (PciDevices, {}),
    "IommuGroups": (IommuGroups, {}),
    "NvidiaGpus": (NvidiaGpus, {}),
    "NvidiaTopology": (NvidiaTopology, {}),
    "NvidiaP2P-r": (NvidiaP2P, {"mode": "r"}),
    "NvidiaP2P-w": (NvidiaP2P, {"mode": "w"}),
    "NvidiaDriver": (NvidiaDriver, {}),
    "NvidiaGpuInformation": (NvidiaGpuInformation, {}),
    "CharDevices": (CharDevices, {}),
    "KernelCmdline": (KernelCmdline, {}),
    "KernelBuildInfo": (KernelBuildInfo, {}),
    "ModuleParameters": (ModuleParameters, {}),
    "CpuVendor": (CpuVendor, {}),
    "BootTool": (BootTool, {}),
    "BootKernelList": (BootKernelList, {}),
    "PveGuestConfigs": (PveGuestConfigs, {}),
    "LoadedModules": (LoadedModules, {}),
    "ConfigFiles": (ConfigFiles, {}),
    "ModuleConfigFiles": (ModuleConfigFiles, {}),
    "BootId": (BootId, {}),
    "SevSnp": (SevSnp, {}),
    "IommuDomains": (IommuDomains, {}),
    "BootPath": (BootPath, {}),
    "GuestStatuses": (GuestStatuses, {}),
    "KernelCompilers": (KernelCompilers, {}),
    "PveContainerVersion": (PveContainerVersion, {}),
    "PanicSettings": (PanicSettings, {}),
    "ZfsUsage": (ZfsUsage, {}),
    "KernelFeatureFiles": (KernelFeatureFiles, {}),
    "HostRelease": (HostReleaseFact, {}),
    "MonitoringState": (MonitoringStateFact, {}),
}
# Facts added after snapshots were first taken: a snapshot without them still loads, with the
# fact's default (no SEV flags, no IOMMU units or group types, a boot path not known, no kernel
# configs or compilers, no ZFS in use, no kernel features), as if the host had shown none; the managed files, loaded modules and
# boot id load as None ("not captured"), and so do the guest statuses.
NOT_CAPTURED = frozenset(
    {
        "LoadedModules",
        "ConfigFiles",
        "ModuleConfigFiles",
        "BootId",
        "GuestStatuses",
        "PveContainerVersion",
        "PanicSettings",
        "MonitoringState",
    }
)
ADDED_LATER = (
    frozenset(
        {
            "SevSnp",
            "IommuDomains",
            "BootPath",
            "KernelCompilers",
            "ZfsUsage",
            "KernelFeatureFiles",
            "HostRelease",
        }
    )
    | NOT_CAPTURED
)


LEGACY_OFF = ("0", "false", "no")  # systemd's boolean "off" spellings for the hierarchy switch


@dataclass
class HostFacts:
    pci: dict[str, PciDevice]
    iommu_groups: dict[int, list[str]]
    gpus: GpuQuery
    topology: Topology | None
    p2p: dict[str, dict[tuple[str, str], str] | None]  # mode ("r", "w") -> matrix
    driver: DriverVersion | None
    gpu_information: dict[str, dict[str, str]]
    char_devices: dict[str, int]
    cmdline: list[str]
    kernel: KernelBuild
    module_parameters: dict[str, dict[str, str]]
    cpu_vendor: str
    boot_tool: BootToolStatus | None
    boot_kernels: BootKernels | None
    guest_configs: dict[tuple[str, int], GuestConfig] = field(default_factory=dict)
    loaded_modules: list[str] | None = None  # None: not captured
    managed: ManagedFiles | None = None  # the files gpuhost manages; None: not captured
    # every modprobe.d/modules-load.d file and /etc/modules, the user's too; None: not captured
    module_config: ManagedFiles | None = None
    boot_id: str | None = None
    sev: SevState = field(default_factory=SevState)
    iommu: IommuState = field(default_factory=IommuState)
    boot_path: BootPathInfo = field(default_factory=BootPathInfo)  # known=False: not captured
    guest_statuses: dict[tuple[str, int], str] | None = None  # None: not captured
    compilers: CompilerInventory = field(default_factory=CompilerInventory)
    pve_container: PackageVersion | None = None  # None: not captured
    panic: dict[str, str] | None = None  # /proc/sys/kernel panic settings; None: not captured
    zfs: ZfsUse = field(default_factory=ZfsUse)
    kernel_features: InstalledKernelFeatures = field(default_factory=InstalledKernelFeatures)
    release: HostRelease = field(default_factory=HostRelease)  # unknown: not captured
    monitoring: MonitoringState | None = None  # the metrics timer's state; None: not captured

    @property
    def files(self) -> dict[str, str] | None:
        return None if self.managed is None else self.managed.files

    @property
    def cgroup_v1_devices(self) -> bool:
        """Whether a container's `lxc.cgroup.devices.*` (v1) keys take effect here: only on the
        hybrid layout, which Proxmox VE 7-8 boot with systemd.unified_cgroup_hierarchy=0 and
        PVE 9 (pve-container 6) no longer has (pve-manager PVE/CLI/pve8to9.pm). On pure cgroup2
        LXC skips them all ("Ignoring legacy cgroup limits on pure cgroup2 system", lxc
        src/lxc/cgroups/cgfsng.c, cgfsng_setup_limits_legacy)."""
        container = (self.pve_container.version or "") if self.pve_container else ""
        if (self.release.pve_major or 0) >= 9 or (
            container.split(".")[0].isdigit() and int(container.split(".")[0]) >= 6
        ):
            return False
        return any(f"systemd.unified_cgroup_hierarchy={v}" in self.cmdline for v in LEGACY_OFF)


def fact_command(key: str) -> str:
    cls, kwargs = FACTS[key]
    return str(cls().command(**kwargs))


def fact_tool(cls: type[Probe], **kwargs: Any) -> str | None:
    """The binary a fact class needs (pyinfra returns the fact's default when it is absent)."""
    tool = cls.requires_command
    return tool(cls(), **kwargs) if callable(tool) else tool


def required_tool(key: str) -> str | None:
    cls, kwargs = FACTS[key]
    return fact_tool(cls, **kwargs)


def _default(cls: type[Probe]) -> Any:
    default = cls.default
    return default() if callable(default) else default


def combined_args(keys: tuple[str, ...] = tuple(FACTS)) -> dict[str, Any]:
    """Arguments for ``host.get_fact(Combined, **combined_args(keys))``: one round trip."""
    return {"commands": Commands((key, fact_command(key), required_tool(key)) for key in keys)}


def parse_raw(raw: dict[str, tuple[int, list[str]]]) -> HostFacts:
    """Parse raw (exit status, stdout lines) per fact key into :class:`HostFacts`."""
    value: dict[str, Any] = {}
    for key, (cls, _) in FACTS.items():
        if key not in raw and key in ADDED_LATER:
            # a snapshot taken before gpuhost read this: the boot loader's files and the boot id
            # are "not captured" (None); the others load with the fact's default
            value[key] = None if key in NOT_CAPTURED else _default(cls)
            continue
        status, lines = raw.get(key, (MISSING_TOOL, []))
        if status == MISSING_TOOL and required_tool(key):
            value[key] = _default(cls)
        elif status != 0:
            raise ValueError(
                f"fact {key} failed with exit status {status}: {' '.join(lines)[:200]}"
            )
        else:
            value[key] = cls().process(lines)
    return HostFacts(
        pci=value["PciDevices"],
        iommu_groups=value["IommuGroups"],
        gpus=value["NvidiaGpus"],
        topology=value["NvidiaTopology"],
        p2p={"r": value["NvidiaP2P-r"], "w": value["NvidiaP2P-w"]},
        driver=value["NvidiaDriver"],
        gpu_information=value["NvidiaGpuInformation"],
        char_devices=value["CharDevices"],
        cmdline=value["KernelCmdline"],
        kernel=value["KernelBuildInfo"],
        module_parameters=value["ModuleParameters"],
        cpu_vendor=value["CpuVendor"],
        boot_tool=value["BootTool"],
        boot_kernels=value["BootKernelList"],
        guest_configs=value["PveGuestConfigs"],
        loaded_modules=value["LoadedModules"],
        managed=value["ConfigFiles"],
        module_config=value["ModuleConfigFiles"],
        boot_id=value["BootId"],
        sev=value["SevSnp"],
        iommu=value["IommuDomains"],
        boot_path=value["BootPath"],
        guest_statuses=value["GuestStatuses"],
        compilers=value["KernelCompilers"],
        pve_container=value["PveContainerVersion"],
        panic=value["PanicSettings"],
        zfs=value["ZfsUsage"],
        kernel_features=value["KernelFeatureFiles"],
        release=value["HostRelease"],
        monitoring=value["MonitoringState"],
    )


def read_snapshot(directory: str | Path) -> dict[str, tuple[int, list[str]]]:
    directory = Path(directory)
    raw = {}
    for key in FACTS:
        rc_file = directory / f"{key}.rc"
        if not rc_file.exists() and key in ADDED_LATER:
            continue  # an older snapshot: parse_raw gives the fact's default
        if not rc_file.exists():
            raise FileNotFoundError(f"{directory}: snapshot has no {key}.rc; capture it again")
        out = directory / f"{key}.out"
        lines = out.read_text().splitlines() if out.exists() else []
        raw[key] = (int(rc_file.read_text().strip()), lines)
    return raw


def write_snapshot(directory: str | Path, raw: dict[str, tuple[int, list[str]]]) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for key, (status, lines) in raw.items():
        (directory / f"{key}.cmd").write_text(fact_command(key) + "\n")
        (directory / f"{key}.out").write_text("".join(line + "\n" for line in lines))
        (directory / f"{key}.rc").write_text(f"{status}\n")


def capture_script() -> str:
    """A POSIX shell script that writes a snapshot of this host into the directory ``$1``."""
    lines = [
        "#!/bin/sh",
        "# Generated by `gpuhost capture-script`: runs every fact command gpuhost's planner reads",
        "# and writes a snapshot (KEY.cmd, KEY.out, KEY.rc) into the directory given as $1.",
        'set -u; out=${1:?usage: $0 OUTDIR}; mkdir -p "$out"; export LANG=C LC_ALL=C',
    ]
    for key in FACTS:
        command = fact_command(key)
        tool = required_tool(key)
        run = (
            f'sh -c {shlex.quote(command)} >"$out/{key}.out" 2>/dev/null; echo $? >"$out/{key}.rc"'
        )
        lines.append(f"printf '%s\\n' {shlex.quote(command)} >\"$out/{key}.cmd\"")
        if tool:
            lines.append(
                f"if command -v {tool} >/dev/null 2>&1; then {run}; "
                f'else echo {MISSING_TOOL} >"$out/{key}.rc"; : >"$out/{key}.out"; fi'
            )
        else:
            lines.append(run)
    return "\n".join(lines) + "\n"
