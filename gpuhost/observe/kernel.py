"""Running-kernel facts: /proc/devices majors, /proc/cmdline, /proc/version, module parameters."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe

# Modules whose parameters gpuhost plans and audits.
MANAGED_MODULES = (
    "nvidia",
    "nvidia_uvm",
    "nvidia_modeset",
    "nvidia_drm",
    "vfio",
    "vfio_pci",
    "vfio_iommu_type1",
)


def parse_char_devices(lines: list[str]) -> dict[str, int]:
    """Char device name -> major from /proc/devices (nvidia and nvidiactl share 195)."""
    majors: dict[str, int] = {}
    section = None
    for line in lines:
        if not line.strip():
            continue
        if line.endswith("devices:"):
            section = line
            continue
        if section is None:
            raise UnparsedOutput("/proc/devices", line, "line before any section")
        major, _, name = line.strip().partition(" ")
        if not major.isdigit() or not name:
            raise UnparsedOutput("/proc/devices", line)
        if section == "Character devices:":
            majors[name] = int(major)
    return majors


class CharDevices(Probe[dict[str, int]]):
    """
    Returns character device majors by name from ``/proc/devices``, e.g.
    ``{"nvidia": 195, "nvidia-uvm": 238, "nvidia-caps": 241}``. nvidia-uvm and nvidia-caps
    majors are dynamic: they change across boots, so container rules must be derived from here.
    """

    default = dict

    def command(self) -> str:
        return "cat /proc/devices"

    def process(self, output: list[str]) -> dict[str, int]:
        return parse_char_devices(output)


class KernelCmdline(Probe[list[str]]):
    """Returns the running kernel's command line from ``/proc/cmdline`` as a list of parameters."""

    default = list

    def command(self) -> str:
        return "cat /proc/cmdline"

    def process(self, output: list[str]) -> list[str]:
        return " ".join(output).split()


# The live settings the trial boot's panic parameters set (kernel.rst: panic, panic_on_oops,
# softlockup_panic, hardlockup_panic, hung_task_panic); a file a kernel lacks (no hard lockup
# detector, say) is left out.
PANIC_SYSCTLS = (
    "panic",
    "panic_on_oops",
    "softlockup_panic",
    "hardlockup_panic",
    "hung_task_panic",
)


class PanicSettings(Probe[dict[str, str]]):
    """Returns /proc/sys/kernel's panic settings: name -> value (``{"panic_on_oops": "0"}``)."""

    default = dict

    def command(self) -> str:
        return f"cd /proc/sys/kernel && grep -H . {' '.join(PANIC_SYSCTLS)} 2>/dev/null; true"

    def process(self, output: list[str]) -> dict[str, str]:
        values = {}
        for line in output:
            name, sep, value = line.partition(":")
            if not sep or name not in PANIC_SYSCTLS or not re.fullmatch(r"-?\d+", value):
                raise UnparsedOutput("panic settings", line)
            values[name] = value
        return values


_PROC_VERSION = re.compile(
    r"^Linux version (?P<release>\S+) \((?P<builder>[^)]*)\) "
    r"\((?P<compiler>.+?), (?P<linker>(?:GNU ld|LLD|ld)\b.*?)\) (?P<build>#.*)$"
)


@dataclass(frozen=True)
class KernelBuild:
    release: str  # 6.14.8-2-bpo12-pve
    compiler: str  # gcc (Debian 12.2.0-14) 12.2.0
    gcc_version: str | None  # 12.2.0; None for a kernel not built by GCC


def parse_kernel_build(lines: list[str]) -> KernelBuild:
    line = " ".join(line.strip() for line in lines if line.strip())
    match = _PROC_VERSION.match(line)
    if not match:
        raise UnparsedOutput("/proc/version", line)
    compiler = match["compiler"]
    last = compiler.split()[-1]
    gcc = last if compiler.startswith("gcc") and re.fullmatch(r"\d+\.\d+\.\d+", last) else None
    return KernelBuild(release=match["release"], compiler=compiler, gcc_version=gcc)


class KernelBuildInfo(Probe[KernelBuild]):
    """
    Returns the running kernel's release and the compiler that built it, from ``/proc/version``.
    The NVIDIA module must be built by the same GCC version (a mismatch bricked a host).
    """

    def command(self) -> str:
        return "cat /proc/version"

    def process(self, output: list[str]) -> KernelBuild:
        return parse_kernel_build(output)


_PARAM_PATH = re.compile(r"^(?P<module>\w+)/parameters/(?P<name>\w+)$")


def parse_module_parameters(lines: list[str]) -> dict[str, dict[str, str]]:
    """``param <module>/parameters/<name>`` for each file, then grep's ``<path>:<value>`` lines;
    a file listed without a value could not be read (a write-only parameter): ``<unreadable>``.
    Output of the command before 2026-12-04 (``<module> <name> <value>``) parses too."""
    listed: list[tuple[str, str]] = []
    values: dict[tuple[str, str], str] = {}
    for line in lines:
        if not line.strip():
            continue
        if line.startswith("param "):
            m = _PARAM_PATH.match(line.removeprefix("param "))
            if m is None or m["module"] not in MANAGED_MODULES:
                raise UnparsedOutput("module parameters", line)
            listed.append((m["module"], m["name"]))
            continue
        path, sep, value = line.partition(":")
        m = _PARAM_PATH.match(path)
        if sep and m is not None and m["module"] in MANAGED_MODULES:
            values[(m["module"], m["name"])] = value
            continue
        module, _, rest = line.partition(" ")  # the earlier command's line
        name, sep, value = rest.partition(" ")
        if not sep or module not in MANAGED_MODULES or not re.fullmatch(r"\w+", name):
            raise UnparsedOutput("module parameters", line)
        listed.append((module, name))
        values[(module, name)] = value
    params: dict[str, dict[str, str]] = {}
    for module, name in listed:
        params.setdefault(module, {})[name] = values.get((module, name), "<unreadable>")
    return params


class ModuleParameters(Probe[dict[str, dict[str, str]]]):
    """
    Returns the live parameters of the loaded modules gpuhost manages, from
    ``/sys/module/<module>/parameters``: ``{"nvidia_uvm": {"uvm_disable_hmm": "Y", ...}}``.
    A module that is not loaded (or built in without parameters) is absent.
    """

    default = dict
    earlier_commands = (
        f"for m in {' '.join(MANAGED_MODULES)}; do for f in /sys/module/$m/parameters/*; do "
        '[ -f "$f" ] || continue; printf "%s %s %s\\n" "$m" "${f##*/}" '
        '"$(cat "$f" 2>/dev/null || echo "<unreadable>")"; done; done',
    )

    def command(self) -> str:
        # One grep for all files (the earlier loop forked a cat per parameter, ~50 on a host
        # with the NVIDIA modules loaded); the shell's own test and printf list them.
        return (
            "cd /sys/module 2>/dev/null || exit 0; set --; "
            f"for m in {' '.join(MANAGED_MODULES)}; do for f in $m/parameters/*; do "
            '[ -f "$f" ] && set -- "$@" "$f"; done; done; '
            '[ $# -gt 0 ] || exit 0; printf "param %s\\n" "$@"; LC_ALL=C grep -asH "" "$@"; true'
        )

    def process(self, output: list[str]) -> dict[str, dict[str, str]]:
        return parse_module_parameters(output)


def parse_cpu_vendor(lines: list[str]) -> str:
    line = " ".join(lines).strip()
    vendor = line.partition(":")[2].strip()
    known = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}
    if not line.startswith("vendor_id") or vendor not in known:
        raise UnparsedOutput("/proc/cpuinfo vendor_id", line)
    return known[vendor]


class CpuVendor(Probe[str]):
    """Returns ``amd`` or ``intel`` from ``/proc/cpuinfo``: it decides the IOMMU parameter."""

    def command(self) -> str:
        return "grep -m1 vendor_id /proc/cpuinfo"

    def process(self, output: list[str]) -> str:
        return parse_cpu_vendor(output)


def parse_loaded_modules(lines: list[str]) -> list[str]:
    """Module names from /proc/modules (``name size refcount deps state address``)."""
    names = []
    for line in lines:
        fields = line.split()
        if len(fields) < 3 or not re.fullmatch(r"\w+", fields[0]) or not fields[1].isdigit():
            raise UnparsedOutput("/proc/modules", line)
        names.append(fields[0])
    return names


class LoadedModules(Probe[list[str]]):
    """Returns the names of the loaded kernel modules (``/proc/modules``), in its order."""

    default = list

    def command(self) -> str:
        return "cat /proc/modules"

    def process(self, output: list[str]) -> list[str]:
        return parse_loaded_modules(output)


# --- SEV / SEV-SNP --------------------------------------------------------------------------------

_SEV_FLAGS = ("sme", "sev", "sev_es", "sev_snp")
_KVM_SEV = re.compile(
    r"^/sys/module/kvm_amd/parameters/(?P<name>sev|sev_es|sev_snp):(?P<value>.*)$"
)


@dataclass(frozen=True)
class SevState:
    """What the running kernel says about AMD memory encryption on this host.

    ``cpu_flags``: the SEV flags of /proc/cpuinfo. The kernel keeps ``sev_snp`` only when the
    firmware enabled SNP and an RMP table was found (arch/x86/kernel/cpu/amd.c,
    bsp_determine_snp clears it otherwise), so it says "this host is an SNP host".
    ``kvm``: kvm_amd's sev/sev_es/sev_snp parameters (absent when kvm_amd is not loaded, as on
    Intel). KVM rewrites sev_snp to what it can actually use (arch/x86/kvm/svm/sev.c,
    sev_hardware_setup), and the AMD IOMMU driver withdraws SNP at boot when the IOMMU is off
    or in passthrough mode (drivers/iommu/amd/init.c, iommu_snp_enable: "SNP: IOMMU disabled or
    configured in passthrough mode, SNP cannot be supported"); then sev_snp reads N while the
    cpu flag stays.
    """

    cpu_flags: frozenset[str] = frozenset()
    kvm: dict[str, bool] = field(default_factory=dict)

    @property
    def snp_host(self) -> bool:
        """The firmware has SEV-SNP on: identity IOMMU domains cost SNP here."""
        return "sev_snp" in self.cpu_flags

    @property
    def snp_usable(self) -> bool | None:
        """Whether KVM can start SEV-SNP guests now; None when kvm_amd is not loaded."""
        return self.kvm.get("sev_snp")


def parse_sev_state(lines: list[str]) -> SevState:
    flags: set[str] = set()
    kvm: dict[str, bool] = {}
    for line in lines:
        if not line.strip():
            continue
        if line.startswith("cpuflag "):
            flag = line.removeprefix("cpuflag ").strip()
            if flag not in _SEV_FLAGS:
                raise UnparsedOutput("SEV state", line, "unknown cpu flag")
            flags.add(flag)
        elif (match := _KVM_SEV.match(line)) and match["value"] in ("Y", "N", "1", "0"):
            # bool module parameters read Y/N; some older kernels made sev an int (1/0)
            kvm[match["name"]] = match["value"] in ("Y", "1")
        else:
            raise UnparsedOutput("SEV state", line)
    return SevState(cpu_flags=frozenset(flags), kvm=kvm)


class SevSnp(Probe[SevState]):
    """
    Returns the host's SEV state: the SEV cpu flags (``sev_snp``: SNP enabled by the firmware)
    and kvm_amd's ``sev``/``sev_es``/``sev_snp`` parameters (what KVM can run now). Empty on
    Intel hosts.
    """

    default = SevState

    def command(self) -> str:
        params = " ".join(
            f"/sys/module/kvm_amd/parameters/{p}" for p in ("sev", "sev_es", "sev_snp")
        )
        return (
            f"grep -H . {params} 2>/dev/null; "
            "grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\\n' | grep -x -E 'sme|sev|sev_es|sev_snp' "
            "| sed 's/^/cpuflag /'; true"
        )

    def process(self, output: list[str]) -> SevState:
        return parse_sev_state(output)


# --- the NVIDIA modules each installed kernel would load -----------------------------------------

_MODULE_LINE = re.compile(r"^(?P<kernel>[^|/]+)\|(?P<path>[^|]*)\|(?P<vermagic>.*)$")


def parse_nvidia_modules(lines: list[str]) -> dict[str, dict[str, str]]:
    """Kernel release -> NVIDIA module name (nvidia, nvidia_uvm...) -> its vermagic."""
    kernels: dict[str, dict[str, str]] = {}
    for line in lines:
        m = _MODULE_LINE.match(line)
        if not m:
            raise UnparsedOutput("NVIDIA modules per kernel", line)
        modules = kernels.setdefault(m["kernel"], {})
        if m["path"] != "-":
            name = m["path"].rsplit("/", 1)[-1].split(".ko")[0].replace("-", "_")
            modules[name] = m["vermagic"].strip()
    return kernels


class NvidiaModuleFiles(Probe[dict[str, dict[str, str]]]):
    """
    Returns, for every kernel in /lib/modules, the NVIDIA modules installed for it and their
    vermagic (``{"6.14.8-2-bpo12-pve": {"nvidia": "6.14.8-2-bpo12-pve SMP preempt mod_unload
    modversions ", ...}}``): a reboot into a kernel without a matching nvidia module leaves
    the GPUs without a driver.
    """

    default = dict

    def command(self) -> str:
        # modinfo where it exists (it reads compressed modules); else the .modinfo strings.
        return (
            'for d in /lib/modules/*/; do [ -d "$d" ] || continue; k=${d%/}; k=${k##*/}; '
            'echo "$k|-|-"; '
            "find \"$d\" \\( -name 'nvidia.ko*' -o -name 'nvidia-uvm.ko*' \\) 2>/dev/null | sort | "
            'while read -r f; do v=$(modinfo -F vermagic "$f" 2>/dev/null || '
            "tr '\\0' '\\n' <\"$f\" | sed -n 's/^vermagic=//p' | head -n 1); "
            'echo "$k|$f|$v"; done; done'
        )

    def process(self, output: list[str]) -> dict[str, dict[str, str]]:
        return parse_nvidia_modules(output)
