"""A twin profile made from a real host's capture (`gpuhost capture`, a snapshot directory).

    raw = gpuhost.observe.hostfacts.read_snapshot("tests/fixtures/captures/h200x1/facts")
    data = profile_from_snapshot(raw, name="h200x1", source="tests/fixtures/captures/h200x1/facts")
    write_profile(data, Path("h200x1.yaml"))      # load_profile(path) starts a twin from it

The snapshot is read by gpuhost's own parsers (hostfacts.parse_raw), so the twin is made of what
gpuhost itself saw. Everything the capture does not say (a CPU model, memory size, a board's
serial, the P2P modes gpuhost does not read) is chosen plainly and written into the profile's
``assumed``, one line per field with the value taken and why. Secrets never enter a profile
(twin/fromcapture_secrets.py). A capture that cannot describe a machine raises
:class:`CaptureError`, naming the fact and the fix.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import yaml

from gpuhost.observe.hostfacts import ADDED_LATER, FACTS, HostFacts, parse_raw
from gpuhost.observe.kernel import _PROC_VERSION
from gpuhost.observe.parse import UnparsedOutput
from gpuhost.redact import show
from twin import fromcapture_gpus, fromcapture_start
from twin.profile import ProfileError, parse_profile
from twin.pve.setup import PVE_DEFAULT_GRUB

# Majors the NVIDIA driver takes at load: fixed ones (the profile's nvidia.fixed_majors) and the
# dynamic ones a first boot reproduces (nvidia.first_boot_majors).
FIXED_MAJORS = ("nvidia-nvswitch", "nvidia-nvlink", "nvidia-caps-imex-channels")
DYNAMIC_MAJORS = ("nvidia-uvm", "nvidia-caps")
# What a boot loader puts on the command line itself, not the user's parameters.
LOADER_PARAMS = re.compile(r"^(BOOT_IMAGE|initrd|root)=|^(ro|rw)$")
DEFAULT_MEMORY_GIB = 512
DEFAULT_CPUS = 32
CPU_MODELS = {"intel": "Intel(R) Xeon(R) Processor", "amd": "AMD EPYC Processor"}


class CaptureError(ValueError):
    """A capture a profile cannot be made from; the message names the fact and the fix."""


def profile_from_snapshot(raw: dict[str, tuple[int, list[str]]], *, name: str, source: str) -> dict:
    """Profile data (plain JSON types) for the host captured in ``raw`` (read_snapshot's dict)."""
    missing = [key for key in FACTS if key not in raw and key not in ADDED_LATER]
    if missing:
        raise CaptureError(
            f"{source}: the capture lacks the facts {', '.join(missing)}; capture the host again"
            " with `gpuhost capture`"
        )
    try:
        facts = parse_raw(raw)
    except UnparsedOutput as exc:
        # the line as gpuhost's messages show values: bounded (it may be a file's base64 text)
        said = str(exc).replace(repr(exc.line), show(exc.line))
        raise CaptureError(
            f"{source}: {said}; capture the host again with `gpuhost capture`"
        ) from None
    except ValueError as exc:  # a fact's command failed: parse_raw names it
        raise CaptureError(f"{source}: {exc}; fix the host's tool or capture again") from None
    if not facts.pci:
        raise CaptureError(
            f"{source}: fact PciDevices is empty (no /sys/bus/pci/devices read); capture the"
            " host itself, not a container, with `gpuhost capture`"
        )
    assumed: list[str] = []
    try:
        data = _profile(facts, raw, name, source, assumed)
    except fromcapture_gpus.Unknown as exc:
        raise CaptureError(f"{source}: {exc}") from None
    data["assumed"] = assumed
    data["source"] = source
    try:
        parse_profile(data, f"profile from {source}")
    except ProfileError as exc:
        raise CaptureError(
            f"{exc}\n(the capture {source} describes no machine the twin can be)"
        ) from None
    return data


def _profile(facts: HostFacts, raw: dict, name: str, source: str, assumed: list[str]) -> dict:
    links = (facts.managed.links if facts.managed else {}).get("/etc/pve/local", "")
    node = links.rsplit("/", 1)[-1] if links.startswith("nodes/") else None
    if node is None:
        assumed.append(f"hostname: {name} (the profile's name; no /etc/pve/local node link)")
    affinities = list(facts.topology.cpu_affinity.values()) if facts.topology else []
    cpus = fromcapture_gpus.cpu_count(affinities)
    if cpus is None:
        cpus = DEFAULT_CPUS
        assumed.append(f"cpu.cpus: {cpus} (no GPU CPU affinity in the capture)")
    numa_nodes = 1 + max(
        [d.numa_node for d in facts.pci.values() if d.numa_node is not None]
        + [n for n in (facts.topology.numa_affinity.values() if facts.topology else []) if n]
        + [0]
    )
    vendor = {"intel": "Intel", "amd": "AMD"}[facts.cpu_vendor]
    assumed.append(
        f"cpu.model_name: {CPU_MODELS[facts.cpu_vendor]!r}, sockets 1, no hypervisor named;"
        f" cpu.numa_nodes {numa_nodes} from the PCI and GPU NUMA nodes (no fact reads lscpu)"
    )
    assumed.append(f"memory_gib: {DEFAULT_MEMORY_GIB} (no fact reads the memory size)")
    gpus = fromcapture_gpus.gpus(facts, assumed, cpus)
    topology = fromcapture_gpus.topology(facts, gpus, assumed)
    data: dict[str, Any] = {
        "name": name,
        "description": f"made from the capture {source}",
        "hostname": node or name,
        "pve": _pve(facts, raw, assumed),
        "cpu": {
            "vendor": vendor,
            "model_name": CPU_MODELS[facts.cpu_vendor],
            "cpus": cpus,
            "numa_nodes": numa_nodes,
        },
        "memory_gib": DEFAULT_MEMORY_GIB,
        "boot": _boot(facts, assumed),
        "pci_devices": _pci(facts, gpus, assumed),
        "gpus": gpus,
        "topology": topology,
        "kernels": _kernels(facts, raw, assumed),
        "failing_kernels": [],
        "quirks": {"sev_snp": facts.sev.snp_host},
        "nvidia": _nvidia(facts, raw, topology, assumed),
        "char_devices": [
            f"{major} {dev}"
            for dev, major in sorted(facts.char_devices.items(), key=lambda kv: kv[1])
            if not dev.startswith("nvidia")
        ],
    }
    assumed.append(
        "quirks.intel_iommu_default_on, quirks.efivars_readonly: false (firmware and kernel"
        " defaults no fact reads)"
    )
    assumed.append(
        "block_devices, dmesg: the twin's defaults (gpuhost reads neither /proc/devices' block"
        " section nor the boot log)"
    )
    if "ZfsUsage" in raw:
        data["zfs_pools"] = [{"name": pool} for pool in facts.zfs.pools]
    else:
        assumed.append("zfs_pools: the twin's default (rpool on a ZFS root): no ZfsUsage")
    data["start"] = fromcapture_start.host_start(facts, raw, assumed)
    return data


def _pve(facts: HostFacts, raw: dict, assumed: list[str]) -> int:
    major = facts.release.pve_major
    if major in (8, 9):
        return major
    by_codename = {"bookworm": 8, "trixie": 9}.get(facts.release.codename or "")
    if by_codename:
        return by_codename
    known = "HostRelease" in raw
    rel = facts.release
    pve = f"Proxmox VE {rel.pve_manager}" if rel.pve_manager else "no Proxmox VE"
    runs = f"the host runs {pve} on {rel.distribution} {rel.debian} ({rel.codename})"
    runs = runs if known else "no HostRelease captured"
    assumed.append(f"pve: 8 (Debian 12 userland): {runs}, no Proxmox VE release to follow")
    return 8


def _direct(facts: HostFacts, assumed: list[str]) -> dict[str, Any] | None:
    """boot.loader none (twin/profile_boot.py) where the capture shows no boot loader: no
    proxmox-boot-tool (BootTool 127), and BootPath without EFI, ESP list or /boot/grub; or,
    without BootPath, a /proc/cmdline that no loader made (GRUB puts BOOT_IMAGE= first,
    include/grub/lib/cmdline.h; systemd-boot initrd=). The hypervisor passes it as it is."""
    path, cmdline = facts.boot_path, facts.cmdline
    if facts.boot_tool is not None or (facts.files or {}).keys() & {"/etc/kernel/cmdline"}:
        return None
    kernels = cmdline[: cmdline.index("--")] if "--" in cmdline else cmdline  # init's after --
    if path.known:
        if path.uefi or path.esp_uuids is not None or path.grub_source or path.grub_fstype:
            return None
    elif any(p.startswith(("BOOT_IMAGE=", "initrd=")) for p in kernels):
        return None
    else:
        assumed.append(
            "boot.loader: none, boot.firmware: bios (no BootPath captured; no proxmox-boot-tool"
            " and /proc/cmdline has no loader's BOOT_IMAGE= or initrd=)"
        )
    firmware = "uefi" if path.uefi else "bios"
    return {"firmware": firmware, "loader": "none", "kernel": facts.kernel.release,
            "kernel_cmdline": " ".join(cmdline)}  # fmt: skip


def _boot(facts: HostFacts, assumed: list[str]) -> dict[str, Any]:
    files = facts.files or {}
    path = facts.boot_path
    tool = facts.boot_tool
    direct = _direct(facts, assumed)
    if direct is not None:
        return direct | _root_fs(facts, assumed)
    if path.known:
        firmware = "uefi" if path.uefi else "bios"
    elif tool is not None and tool.booted_with:
        firmware = "uefi" if tool.booted_with == "uefi" else "bios"
    else:
        firmware = "uefi"
        assumed.append("boot.firmware: uefi (no BootPath or proxmox-boot-tool in the capture)")
    boot: dict[str, Any] = {"firmware": firmware}
    esps = list(path.esp_uuids or ()) or [u for u, _, _ in (tool.esps if tool else [])]
    if tool is not None and tool.configured and tool.esps:
        boot["loader"] = tool.loader
        boot["grub_on_esp"] = tool.loader == "grub"
    elif "/etc/kernel/cmdline" in files and firmware == "uefi" and esps:
        boot["loader"] = "systemd-boot"
    else:
        boot["loader"] = "grub"
        if "/etc/default/grub" not in files:
            assumed.append(
                "boot.loader: grub (the capture shows no boot loader: no proxmox-boot-tool ESPs,"
                " no /etc/kernel/cmdline or /etc/default/grub)"
            )
    if esps:
        boot["esp_uuids"] = esps
    params = [p for p in facts.cmdline if not LOADER_PARAMS.search(p)]
    if "--" in params:  # what follows "--" is init's, not the kernel's (kernel-parameters.rst)
        params = params[: params.index("--")]
    if boot["loader"] == "systemd-boot":
        text = files.get("/etc/kernel/cmdline", "").split("\n")[0].strip()
        boot["kernel_cmdline"] = text
    elif "/etc/default/grub" in files:
        boot["default_grub"] = files["/etc/default/grub"]
    else:
        boot["default_grub"] = PVE_DEFAULT_GRUB.replace(
            'GRUB_CMDLINE_LINUX_DEFAULT="quiet"', f'GRUB_CMDLINE_LINUX_DEFAULT="{" ".join(params)}"'
        )
        assumed.append(
            "boot.default_grub: Proxmox's installer default with GRUB_CMDLINE_LINUX_DEFAULT set"
            " to the running kernel's parameters (/proc/cmdline without the loader's root=,"
            " BOOT_IMAGE=, initrd=, ro/rw and init's arguments after --): no /etc/default/grub"
            " captured"
        )
    if path.grub_source:
        boot["boot_on_lvm"] = path.grub_source.startswith(("/dev/mapper/", "/dev/dm-"))
    elif boot["loader"] == "grub" and not boot.get("grub_on_esp"):
        assumed.append("boot.boot_on_lvm: true (Proxmox's ext4/xfs install; /boot/grub not read)")
    return boot | _root_fs(facts, assumed)


def _root_fs(facts: HostFacts, assumed: list[str]) -> dict[str, str]:
    fstype = facts.zfs.root_fstype
    if fstype in ("zfs", "btrfs", "ext4"):
        return {"root_fs": fstype}
    if fstype:
        assumed.append(f"boot.root_fs: ext4 (the host's / is {fstype}, which the twin lacks)")
        return {"root_fs": "ext4"}
    return {}


def _pci(facts: HostFacts, gpus: list[dict], assumed: list[str]) -> list[dict[str, Any]]:
    irqs = {g["bdf"]: g.get("irq", 0) for g in gpus}
    out = []
    for dev in sorted(facts.pci.values(), key=lambda d: d.bdf):
        entry: dict[str, Any] = {
            "bdf": dev.bdf,
            "vendor": dev.vendor,
            "device": dev.device,
            "class": dev.class_code,
            "subsystem_vendor": dev.subsystem_vendor or "0000",
            "subsystem_device": dev.subsystem_device or "0000",
            "numa_node": -1 if dev.numa_node is None else dev.numa_node,
            "parent": dev.parent,
            "iommu_group": dev.iommu_group,
        }
        # the driver the kernel bound at boot; the NVIDIA and VFIO bindings are the driver
        # stack's and the deploy's, which the twin makes itself
        if dev.driver and not dev.driver.startswith(("nvidia", "vfio", "nouveau")):
            entry["driver"] = dev.driver
        if dev.bdf in irqs:
            entry["irq"] = irqs[dev.bdf]
        out.append(entry)
    assumed.append(
        "pci_devices[*].revision 00, acs false, modules [], reset_methods [], irq 0 (GPUs: the"
        " driver's IRQ): the PciDevices fact reads ids, class, NUMA node, parent, IOMMU group"
        " and driver only"
    )
    return out


def _kernels(facts: HostFacts, raw: dict, assumed: list[str]) -> list[dict[str, Any]]:
    running = facts.kernel
    line = " ".join(line.strip() for line in raw["KernelBuildInfo"][1] if line.strip())
    build = _PROC_VERSION.match(line)  # gpuhost's own /proc/version pattern (parse_kernel_build)
    releases = {running.release}
    releases |= set(facts.boot_kernels.all if facts.boot_kernels else [])
    # an installed kernel has /boot/config-<release> or System.map-<release> (acs read); a
    # /lib/modules/<release> with only headers (build/.config) or modules is what a removed
    # kernel leaves behind, or a base's headers: no kernel to boot
    releases |= {k for k, src in facts.compilers.kernels.items() if src.keys() - {"build"}}
    releases |= {k for k, f in facts.kernel_features.kernels.items() if f.acs_override is not None}
    out = []
    guessed = []
    for release in sorted(releases):
        compiler = facts.compilers.kernel_compiler(release)
        if compiler is None:
            compiler = running.compiler
            if release != running.release:
                guessed.append(release)
        kernel: dict[str, Any] = {"version": release, "gcc": compiler}
        if release == running.release and build:
            kernel |= {"ld": build["linker"], "builder": build["builder"], "build": build["build"]}
        features = facts.kernel_features.kernels.get(release)
        proxmox = release.endswith("-pve")
        kernel["zfs"] = features.zfs if features else proxmox
        acs = features.acs_override if features else None
        kernel["acs_override"] = proxmox if acs is None else acs
        if "KernelFeatureFiles" in raw and features is None:
            kernel["in_tree_modules"] = False  # it read every /lib/modules/*/: none for this one
        out.append(kernel)
    if guessed:
        assumed.append(
            f"kernels {', '.join(guessed)}: gcc {running.compiler!r}, the running kernel's (no"
            " config of theirs names CONFIG_CC_VERSION_TEXT in the capture)"
        )
    if any(r not in facts.kernel_features.kernels for r in releases):
        assumed.append(
            "kernels[*].zfs, acs_override: true for Proxmox kernels (-pve), false for others,"
            " where KernelFeatureFiles does not say"
        )
    if "KernelFeatureFiles" not in raw:
        assumed.append(
            "kernels[*].in_tree_modules: true (/lib/modules not read: no KernelFeatureFiles)"
        )
    return out


def _nvidia(facts: HostFacts, raw: dict, topology: dict, assumed: list[str]) -> dict[str, Any]:
    nvidia: dict[str, Any] = {}
    lines = [line for line in raw["NvidiaDriver"][1] if line.strip()]
    tag = lines[0].partition("Release Build  ")[2] if lines else ""
    if tag:
        nvidia["build_tag"] = tag
    majors = facts.char_devices
    fixed = {n: majors[n] for n in FIXED_MAJORS if n in majors}
    if fixed:
        nvidia["fixed_majors"] = {"nvidia-nvswitch": 239, "nvidia-nvlink": 240} | fixed
        nvidia["fixed_majors"].setdefault("nvidia-caps-imex-channels", 242)
    nvidia["first_boot_majors"] = {n: majors[n] for n in DYNAMIC_MAJORS if n in majors}
    nvidia["nvlink_links"] = fromcapture_gpus.nvlink_links(topology["links"])
    if facts.driver is None:
        assumed.append("nvidia.build_tag, majors: the twin's defaults (no driver loaded)")
    return nvidia


class _Dumper(yaml.SafeDumper):
    """Multi-line text (files, GRUB defaults, guest configs) as YAML literal blocks."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _flat(values: list) -> bool:
    """One line for a collection of short one-line scalars (a PCI device, a matrix row)."""
    return (
        all(
            v is None or isinstance(v, bool | int) or (isinstance(v, str) and "\n" not in v)
            for v in values
        )
        and sum(len(str(v)) for v in values) < 400
    )


def _mapping(dumper: yaml.SafeDumper, value: dict) -> yaml.Node:
    flow = bool(value) and _flat(list(value.values())) and len(value) > 1 and "bdf" in value
    return dumper.represent_mapping("tag:yaml.org,2002:map", value, flow_style=flow)


def _sequence(dumper: yaml.SafeDumper, value: list) -> yaml.Node:
    flow = _flat(value) and all(isinstance(v, str) and len(v) < 12 for v in value)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)


_Dumper.add_representer(str, _text)
_Dumper.add_representer(dict, _mapping)
_Dumper.add_representer(list, _sequence)


def write_profile(data: dict, path: Path) -> None:
    """Write profile ``data`` as YAML with a header saying where it came from."""
    source = data.get("source") or "an unknown capture"
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"# Twin profile {data.get('name')!r} made by twin/fromcapture.py from {source}"
        f" ({when}).\n# What the capture could not say is listed under `assumed`; secrets were"
        " left out or redacted.\n"
    )
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(header + body)
