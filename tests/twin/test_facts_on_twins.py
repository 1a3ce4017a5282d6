"""gpuhost's facts against twins: every fact parses every profile's shim output, and on the
h200x2 twin each fact's output equals the real capture (modulo UUIDs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuhost.observe.hostfacts import FACTS, parse_raw, read_snapshot
from gpuhost.observe.kernel import parse_char_devices
from gpuhost.observe.live import gather
from twin import driver
from twin.profile import load_profile
from twin.pytest_plugin import TwinHandle

PROFILES = ["kpro6", "h200x2", "lumped", "sevsnp"]
FIXTURE = "tests/fixtures/captures/h200x2/facts"
# Facts whose output is the hardware's (the capture machine was a Firecracker VM with a GCC 15
# kernel and no Proxmox: its kernel, command line and Proxmox facts differ from a twin's).
SAME_AS_CAPTURE = [
    "PciDevices",
    "IommuGroups",
    "NvidiaGpus",
    "NvidiaTopology",
    "NvidiaP2P-r",
    "NvidiaP2P-w",
    "NvidiaGpuInformation",
    "ModuleParameters",
    "CpuVendor",
]
UUID = re.compile(r"GPU-[0-9a-f-]{36}")
DYNAMIC = ("nvidia-uvm", "nvidia-caps")


def host_data(twin: TwinHandle) -> dict:
    return {
        "ssh_hostname": twin.address,
        "ssh_user": "root",
        "ssh_key": str(twin.key),
        "ssh_known_hosts_file": str(twin.known_hosts),
        "ssh_strict_host_key_checking": "yes",
    }


@pytest.fixture(scope="module")
def booted(twin_fleet) -> dict[str, TwinHandle]:
    """One twin per profile with a simulated NVIDIA driver of the capture's version, plus a
    kpro6 twin without one. All start before the first connection: pyinfra reads known_hosts
    once per process."""
    handles = dict(zip(PROFILES, (twin_fleet.start(1, p)[0] for p in PROFILES), strict=True))
    for handle in handles.values():
        driver.install(handle.twin, "580.159.04")
        # the capture machine had nvidia_uvm loaded (something had used CUDA)
        assert handle.run("nvidia-modprobe -u -c=0")[0] == 0
    handles["no-driver"] = twin_fleet.start(1, "kpro6")[0]
    yield handles
    for handle in handles.values():
        twin_fleet.stop(handle)


@pytest.mark.parametrize("profile", PROFILES)
def test_every_fact_parses_the_twin(profile: str, booted: dict[str, TwinHandle]) -> None:
    twin = booted[profile]
    facts = parse_raw(gather([(twin.name, host_data(twin))])[twin.name])
    gpus = load_profile(profile).gpus
    assert [g.bdf for g in facts.gpus.gpus] == [
        g.bdf for g in gpus if g.bdf in {x.bdf for x in facts.gpus.gpus}
    ]
    assert facts.driver is not None and facts.driver.version == "580.159.04" and facts.driver.open
    assert facts.boot_tool is not None  # proxmox-boot-tool answers on every twin
    assert facts.kernel.gcc_version == "12.2.0"
    assert {d.bdf for d in facts.pci.values() if d.is_gpu} == {g.bdf for g in gpus}


def test_h200x2_twin_facts_equal_the_real_capture(booted: dict[str, TwinHandle]) -> None:
    twin = booted["h200x2"]
    raw = gather([(twin.name, host_data(twin))])[twin.name]
    real = read_snapshot(FIXTURE)
    for key in SAME_AS_CAPTURE:
        ours = [mask(line) for line in raw[key][1]]
        theirs = [mask(line) for line in real[key][1]]
        if key == "PciDevices":  # find lists in directory order, which no parser relies on
            ours, theirs = sorted(ours), sorted(theirs)
        cls, _ = FACTS[key]
        if Path(FIXTURE, f"{key}.cmd").read_text().rstrip("\n") in cls.earlier_commands:
            # captured with the probe's earlier command (no 2-GPU machine to retake it): the
            # same facts, in the current command's words
            assert raw[key][0] == real[key][0] == 0, key
            assert cls().process(ours) == cls().process(theirs), key
            continue
        assert (raw[key][0], ours) == (real[key][0], theirs), key
    # /proc/devices: the same devices; nvidia-uvm and nvidia-caps majors are dynamic per boot
    ours, theirs = (parse_char_devices(r["CharDevices"][1]) for r in (raw, real))
    assert set(ours) == set(theirs)
    assert {k: v for k, v in ours.items() if k not in DYNAMIC} == {
        k: v for k, v in theirs.items() if k not in DYNAMIC
    }


def mask(line: str) -> str:
    return UUID.sub("GPU-<uuid>", line)  # UUIDs differ per board


def test_facts_without_a_driver(booted: dict[str, TwinHandle]) -> None:
    twin = booted["no-driver"]
    facts = parse_raw(gather([(twin.name, host_data(twin))])[twin.name])
    assert facts.driver is None and facts.topology is None
    assert facts.gpus.error is not None and "NVIDIA-SMI has failed" in facts.gpus.error
    assert len([d for d in facts.pci.values() if d.is_gpu]) == 8
