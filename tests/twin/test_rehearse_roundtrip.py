"""Round trip (issue 25, item 3): a twin made from a capture gives back, through gpuhost's own
read (`gather`, one SSH round trip, as `gpuhost capture` reads a host), the facts the capture
held, field by field on the parsed HostFacts.

capture -> twin.fromcapture.profile_from_snapshot -> a twin (one per capture, started together)
-> gpuhost.observe.live.gather -> parse_raw, against parse_raw of the capture. Every HostFacts
field is compared exactly, except those of the tables below, each with its reason:
- NEVER: no twin can give them back;
- PARTLY: compared on the part that can round-trip (the projection), the rest named;
- and the fields a snapshot does not hold (taken before gpuhost read them: kpro6-facts,
  h200x2), which read as their defaults or None there: `not_captured` lists them per capture.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpuhost.observe.hostfacts import FACTS, HostFacts, parse_raw, read_snapshot
from gpuhost.observe.live import gather
from twin.fromcapture import profile_from_snapshot, write_profile
from twin.pytest_plugin import TwinHandle

CAPTURES = {
    "kpro6": "examples/kpro6-facts",
    "h200x1": "tests/fixtures/captures/h200x1/facts",
    "h200x2": "tests/fixtures/captures/h200x2/facts",
}
# Which facts fill each HostFacts field (gpuhost/observe/hostfacts.py parse_raw).
KEYS: dict[str, tuple[str, ...]] = {
    "pci": ("PciDevices",),
    "iommu_groups": ("IommuGroups",),
    "gpus": ("NvidiaGpus",),
    "topology": ("NvidiaTopology",),
    "p2p": ("NvidiaP2P-r", "NvidiaP2P-w"),
    "driver": ("NvidiaDriver",),
    "gpu_information": ("NvidiaGpuInformation",),
    "char_devices": ("CharDevices",),
    "cmdline": ("KernelCmdline",),
    "kernel": ("KernelBuildInfo",),
    "module_parameters": ("ModuleParameters",),
    "cpu_vendor": ("CpuVendor",),
    "boot_tool": ("BootTool",),
    "boot_kernels": ("BootKernelList",),
    "guest_configs": ("PveGuestConfigs",),
    "loaded_modules": ("LoadedModules",),
    "managed": ("ConfigFiles",),
    "module_config": ("ModuleConfigFiles",),
    "boot_id": ("BootId",),
    "sev": ("SevSnp",),
    "iommu": ("IommuDomains",),
    "boot_path": ("BootPath",),
    "guest_statuses": ("GuestStatuses",),
    "compilers": ("KernelCompilers",),
    "pve_container": ("PveContainerVersion",),
    "panic": ("PanicSettings",),
    "zfs": ("ZfsUsage",),
    "kernel_features": ("KernelFeatureFiles",),
    "release": ("HostRelease",),
    "monitoring": ("MonitoringState",),
}

# Fields no twin gives back, and why.
NEVER = {
    "boot_id": "a new random id at every boot (the kernel's /proc/sys/kernel/random/boot_id)",
}

Projection = Callable[[HostFacts, HostFacts], Any]  # (facts, the capture's) -> what is compared
_LOADER_WORDS = ("BOOT_IMAGE=", "initrd=")
# The boot loader's own files: the twin's loader is configured by them (twin/startstate.py
# keeps them where the capture had none), and the twin's API keeps its own CA certificate.
_TWINS_OWN = ("/etc/default/grub", "/etc/kernel/cmdline", "/etc/pve/pve-root-ca.pem", "/etc/pve/storage.cfg")  # fmt: skip


def _cmdline(facts: HostFacts, real: HostFacts) -> list[str]:
    """In full where the capture booted through a loader too; else without its word."""
    words = list(facts.cmdline)
    if real.cmdline and real.cmdline[0].startswith(_LOADER_WORDS):
        return words
    return words[1:] if words and words[0].startswith(_LOADER_WORDS) else words


def _managed(facts: HostFacts, real: HostFacts) -> tuple[dict, dict] | None:
    if facts.managed is None:
        return None
    captured = real.managed.files if real.managed else {}
    files = {p: t for p, t in facts.managed.files.items() if p not in _TWINS_OWN or p in captured}
    return files, {p: t for p, t in facts.managed.links.items() if p != "/etc/pve/local"}


def _boot_path(facts: HostFacts, real: HostFacts) -> tuple:
    b = facts.boot_path
    grub = (
        (b.grub_source, b.grub_fstype, b.grub_devid, b.grubenv)
        if real.boot_path.grub_source
        else ()
    )
    return (b.known, b.uefi, b.efivars, b.esp_uuids, b.pin, b.next_boot_pin, grub)


def _compilers(facts: HostFacts, real: HostFacts) -> dict[str, str | None]:
    return {k: facts.compilers.kernel_compiler(k) for k in real.compilers.kernels}


def _kernel_features(facts: HostFacts, real: HostFacts) -> dict:
    return {k: facts.kernel_features.kernels.get(k) for k in real.kernel_features.kernels}


def _monitoring(facts: HostFacts, real: HostFacts) -> Any:
    m = facts.monitoring
    return None if m is None else dataclasses.replace(m, python=None)


# Fields compared in part: (why the rest cannot round-trip, the part compared).
PARTLY: dict[str, tuple[str, Projection]] = {
    "cmdline": (
        "the loader's first word: the twin boots through its profile's loader, which puts"
        " BOOT_IMAGE= (GRUB, include/grub/lib/cmdline.h) or initrd= (systemd-boot) first; the"
        " H200 microVMs' kernel is started by Firecracker directly, with no such word",
        _cmdline,
    ),
    "managed": (
        "the twin's boot loader needs its files (/etc/default/grub, /etc/kernel/cmdline) where"
        " the capture had no loader, and its Proxmox API its own CA (/etc/pve/pve-root-ca.pem);"
        " pmxcfs links /etc/pve/local to the node it runs on, the twin's own name (twinN)",
        _managed,
    ),
    "boot_path": (
        "what the twin's loader and disk are where the capture had none of them: GRUB's"
        " source, fs and grubenv (a microVM has no loader); `df /boot` is this machine's disk;"
        " bootctl comes with the twin's Debian userland (systemd), not the capture's Ubuntu",
        _boot_path,
    ),
    "compilers": (
        "the userland's compilers are the twin's Debian 12 gcc-12, not the capture's; the twin"
        " keeps each kernel's config in /boot and installs headers for it (a `build` config)"
        " and for its base's Debian kernel; compared: each captured kernel's compiler",
        _compilers,
    ),
    "kernel_features": (
        "the twin's module trees: the driver's modules go to /lib/modules/<kver>/updates (the"
        " microVMs' came from outside /lib/modules), and its Debian base's 6.1 kernel has one;"
        " compared: the captured kernels",
        _kernel_features,
    ),
    "monitoring": (
        "python3's version is the twin's Debian userland's (3.11 on Debian 12)",
        _monitoring,
    ),
}


def not_captured(raw: dict) -> list[str]:
    """Fields none of whose facts the snapshot holds (it was taken before gpuhost read them)."""
    return [f for f, keys in KEYS.items() if not any(k in raw for k in keys)]


def host_data(twin: TwinHandle) -> dict:
    return {
        "ssh_hostname": twin.address,
        "ssh_user": "root",
        "ssh_key": str(twin.key),
        "ssh_known_hosts_file": str(twin.known_hosts),
        "ssh_strict_host_key_checking": "yes",
    }


@pytest.fixture(scope="module")
def round_trip(twin_fleet, tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """(capture raw, twin raw) per capture: every profile made, then one twin per capture
    started together and read in one gather (pyinfra reads known_hosts once per process)."""
    tmp = tmp_path_factory.mktemp("roundtrip")
    t0 = time.monotonic()
    captured = {name: read_snapshot(path) for name, path in CAPTURES.items()}
    profiles = []
    for name, raw in captured.items():
        path = tmp / f"{name}.yaml"
        write_profile(profile_from_snapshot(raw, name=name, source=CAPTURES[name]), path)
        profiles.append(str(path))
    made = time.monotonic()
    twins = twin_fleet.start_profiles(profiles)
    up = time.monotonic()
    read = gather([(t.name, host_data(t)) for t in twins])
    done = time.monotonic()
    print(
        f"\nround trip: profiles {made - t0:.1f} s, {len(twins)} twins up {up - made:.1f} s,"
        f" gather {done - up:.1f} s, total {done - t0:.1f} s"
    )
    yield {n: (captured[n], read[t.name]) for n, t in zip(CAPTURES, twins, strict=True)}
    for twin in twins:
        twin_fleet.stop(twin)


def test_every_field_is_compared_or_listed() -> None:
    fields = {f.name for f in dataclasses.fields(HostFacts)}
    assert set(KEYS) == fields
    assert {k for keys in KEYS.values() for k in keys} == set(FACTS)
    assert not (set(NEVER) & set(PARTLY))


@pytest.mark.parametrize("name", list(CAPTURES))
def test_facts_round_trip(name: str, round_trip: dict[str, tuple[dict, dict]]) -> None:
    raw, twin_raw = round_trip[name]
    real, ours = parse_raw(raw), parse_raw(twin_raw)
    skipped = set(not_captured(raw)) | set(NEVER)
    differ = {}
    exact = partly = 0
    for field in dataclasses.fields(HostFacts):
        if field.name in skipped:
            continue
        if field.name in PARTLY:
            project = PARTLY[field.name][1]
            a, b = project(real, real), project(ours, real)
            partly += 1
        else:
            a, b = getattr(real, field.name), getattr(ours, field.name)
            exact += 1
        if a != b:
            differ[field.name] = (a, b)
    print(
        f"\n{name}: {exact} fields exact, {partly} in part, {len(skipped)} not compared"
        f" ({', '.join(sorted(skipped))})"
    )
    assert not differ, "\n".join(
        f"{f}:\n  capture {a}\n  twin    {b}" for f, (a, b) in differ.items()
    )
