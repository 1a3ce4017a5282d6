"""The audit's checks on real captured output: the host command's output from the 1x H200
machine (tests/fixtures/captures/h200x1-audit-run, taken by tools/device-audit.sh) and from
the 1x H100 one (h100x1-audit-run), replayed.

The same inventories as on the machine give the same results: the true one passes every check
that applies, and each wrong expectation fails with exactly its own finding.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuhost.audit.observe import (
    CHANGED_SINCE_CAPTURES,
    READ_SINCE_CAPTURES,
    host_command,
    in_container,
    observe_host,
)
from gpuhost.audit.run import audit_all, read_host
from gpuhost.observe.cuda import DEFAULT_SIZES, parse_cuda_probe
from gpuhost.observe.devices import parse_device_nodes
from gpuhost.observe.kernel import parse_nvidia_modules
from gpuhost.observe.nvidia_driver import parse_fabricmanager, parse_firmware_files, parse_userspace
from gpuhost.spec.inventory import load_inventory

CAPTURES = Path(__file__).parents[1] / "fixtures/captures"
RUN = CAPTURES / "h200x1-audit-run"
WRONG = "tests/fixtures/inventories/audit/h200_wrong.py"
APPLIES = {
    "gpus.inventory",
    "gpus.binding",
    "driver.version",
    "driver.compiler",
    "driver.firmware",
    "driver.userspace",
    "boot.cmdline",
    "boot.loader",
    "boot.panic",
    "modules.loaded",
    "modules.files",
    "cuda.host",
    "p2p.data",
}


def replayer(run: Path):
    def replay(command: str) -> tuple[int, str, str]:
        """The capture's output, for exactly today's command (less any fact read since the
        capture, gpuhost.audit.observe.READ_SINCE_CAPTURES), with the commands it ran then
        (CHANGED_SINCE_CAPTURES)."""
        recorded = (run / "audit-host.cmd").read_text().rstrip("\n")
        assert command == host_command(DEFAULT_SIZES)
        captured = host_command(DEFAULT_SIZES, READ_SINCE_CAPTURES, CHANGED_SINCE_CAPTURES)
        assert captured == recorded, (
            "the host command changed: recapture with tools/device-audit.sh"
        )
        return 0, (run / "audit-host.out").read_text(), ""

    return replay


replay = replayer(RUN)


def audit(inventory: str, name: str, run: Path = RUN):
    spec = load_inventory(inventory)[name][0]
    return audit_all(read_host(name, spec, replayer(run)))


@pytest.mark.parametrize(
    ("inventory", "host", "run"),
    [
        ("inventory/h200.py", "h200", RUN),
        ("inventory/h100.py", "h100", CAPTURES / "h100x1-audit-run"),
    ],
)
def test_true_inventory_passes_every_check_that_applies(inventory, host, run):
    outcomes = audit(inventory, host, run)
    assert {o.check.id for o in outcomes if o.status == "passed"} == APPLIES
    assert not [o for o in outcomes if o.status == "failed"]
    skipped = {o.check.id: o.skipped for o in outcomes if o.status == "skipped"}
    assert (
        skipped["driver.next_boot"]
        == "which kernel boots next is unknown here (no proxmox-boot-tool)"
    )
    assert skipped["driver.fabricmanager"] == "no NVSwitch on the PCI bus"
    assert skipped["boot.iommu_groups"] == "no VM has GPUs"


@pytest.mark.parametrize(
    ("host", "failed", "found"),
    [
        ("h200-driver", {"driver.version"}, ["driver 580.159.04"]),
        ("h200-hmm", {"modules.parameters", "modules.files"}, ["N", "missing"]),
        ("h200-count", {"gpus.inventory"}, ["1: 0000:00:06.0"]),
    ],
)
def test_each_wrong_expectation_fails_with_its_own_finding(host, failed, found):
    outcomes = audit(WRONG, host)
    bad = [o for o in outcomes if o.status == "failed"]
    assert {o.check.id for o in bad} == failed
    assert sorted(f.found for o in bad for f in o.findings) == sorted(found)
    assert all(f.fix for o in bad for f in o.findings)


def test_one_remote_command_reads_the_host():
    spec = load_inventory("inventory/h200.py")["h200"][0]
    assert read_host("h200", spec, replay).commands == 1


def test_real_probe_and_nodes_parse():
    view = observe_host(replay)
    assert view.cuda.init == "CUDA_SUCCESS" and view.cuda.devices == ("0000:00:06.0",)
    assert view.cuda.userspace_version == "580.159.04" and view.cuda.driver_api == 13000
    assert [c.intact for c in view.cuda.copies] == [True]
    assert view.nodes["/dev/nvidia-uvm"].numbers == "238:0"
    assert view.nodes["/dev/nvidiactl"].numbers == "195:255"
    assert view.userspace == {"libcuda": ["580.159.04"], "libnvidia-ml": ["580.159.04"]}
    assert view.firmware == {} and view.modules == {}
    assert view.fabric.version is None


def test_parsers_on_the_formats_they_read():
    nodes = parse_device_nodes(
        ["/dev/nvidia-caps|directory|0|0", "/dev/nvidia3|character special file|c3|3"]
    )
    assert nodes["/dev/nvidia3"].numbers == "195:3" and nodes["/dev/nvidia-caps"].kind == "d"
    assert parse_firmware_files(["/lib/firmware/nvidia/595.71.05/gsp_ga10x.bin"]) == {
        "595.71.05": ["gsp_ga10x.bin"]
    }
    assert parse_userspace(["/usr/lib/x86_64-linux-gnu/libcuda.so.595.71.05"]) == {
        "libcuda": ["595.71.05"]
    }
    assert parse_fabricmanager(["package=595.71.05-1", "active=active"]).version == "595.71.05"
    modules = parse_nvidia_modules(
        [
            "6.14.8-2-bpo12-pve|-|-",
            "6.14.8-2-bpo12-pve|/lib/modules/6.14.8-2-bpo12-pve/updates/dkms/nvidia-uvm.ko|6.14.8-2-bpo12-pve SMP preempt mod_unload modversions ",
            "6.8.12-9-pve|-|-",
        ]
    )
    assert modules == {
        "6.14.8-2-bpo12-pve": {
            "nvidia_uvm": "6.14.8-2-bpo12-pve SMP preempt mod_unload modversions"
        },
        "6.8.12-9-pve": {},
    }
    crashed = parse_cuda_probe(["Traceback (most recent call last):", "Segmentation fault"])
    assert crashed.init is None and "Segmentation fault" in crashed.error


def test_guest_commands_go_through_pct_exec_quoted():
    assert in_container(200, "echo 'a b'") == "pct exec 200 -- sh -c 'echo '\"'\"'a b'\"'\"''"


def test_a_corrupted_peer_copy_is_a_finding():
    spec = load_inventory("inventory/h200.py")["h200"][0]
    host = read_host("h200", spec, replay)
    cuda = host.context.host.cuda
    bad = dataclasses.replace(
        cuda.copies[0], sizes=((4096, True, None), (1048576, False, 524288), (67108864, True, None))
    )
    host.context.host.cuda = dataclasses.replace(cuda, copies=(bad,))
    outcome = next(o for o in audit_all(host) if o.check.id == "p2p.data")
    assert outcome.status == "failed"
    assert outcome.findings[0].found == "corrupted: 1048576 B (first bad byte at 524288)"


def _pytest_audit(*args: str):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/audit", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_suite_needs_an_inventory_and_a_known_host():
    run = _pytest_audit("-rs")  # collected with a checkout's other tests: skipped, saying why
    assert run.returncode == 0
    assert "the audit needs the inventory that describes the host: --inventory FILE" in run.stdout
    run = _pytest_audit("--inventory", "inventory/h200.py", "--hosts=ssh://root@elsewhere")
    assert run.returncode == 2
    assert "--hosts ssh://root@elsewhere: no host 'elsewhere' in inventory/h200.py" in run.stdout


def test_the_suite_lists_one_test_per_check_and_target():
    run = _pytest_audit("--inventory", "inventory/kpro6.py", "--collect-only", "-q")
    ids = [line.split("[", 1)[1].rstrip("]") for line in run.stdout.splitlines() if "[" in line]
    assert "kpro6::driver.version" in ids and "kpro6/ct200::ct.cuda" in ids
    assert "kpro6/vm129::vm.hostpci" in ids and "kpro6/vm129::ct.cuda" not in ids
    assert len(ids) == len(set(ids)) == 27 + 11 + 3  # host, ct200's (7 + 4 software), vm129's
