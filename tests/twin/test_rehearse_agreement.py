"""Agreement with reality (issue 25, item 4): a twin made from the real h200x1 capture gives the
audit results of the real run recorded in tests/fixtures/captures/h200x1-audit-run, check by
check, for inventory/h200.py and the three wrong inventories of
tests/fixtures/inventories/audit/h200_wrong.py.

The twin is made the way `gpuhost rehearse` makes it: twin/fromcapture.py's profile of
h200x1/facts (taken on a bare machine: no gpuhost file there), started with its `start` section.
Then it gets what tools/device-audit.sh did on the real machine before auditing: the Plan's
files of the `modules` and `devices` concerns written as a deploy would (tools/write-plan-files.py;
the real machine cannot run a deploy). Each audit reads the twin over SSH, one command, as the
real run read the machine with `--hosts=local://`.

Where the twin's result differs from the real one, DIFFERENCES says why; every other check must
agree. The second part: the twins of h200x1 and h200x2 (which has no audit run recorded) plan as
their captures do, but for the lines PLAN_DIFFERENCES explains.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhost.audit.connect import host_runner
from gpuhost.audit.plugin import Target
from gpuhost.audit.run import audit_all, read_host
from gpuhost.control import read_control
from gpuhost.observe.cuda import DEFAULT_SIZES
from gpuhost.observe.hostfacts import combined_args, parse_raw, read_snapshot
from gpuhost.observe.snapshot import Combined
from gpuhost.plan.make import make_plan
from gpuhost.plan.render import render_plan
from gpuhost.spec.inventory import load_inventory
from twin.fromcapture import profile_from_snapshot, write_profile
from twin.pytest_plugin import TwinHandle

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = "tests/fixtures/captures/h200x1/facts"
RUN = ROOT / "tests/fixtures/captures/h200x1-audit-run"
# the recorded report of each inventory host, and the inventory it came from
HOSTS = {
    "h200": ("inventory/h200.py", "h200-pass"),
    "h200-driver": ("tests/fixtures/inventories/audit/h200_wrong.py", "h200-driver"),
    "h200-hmm": ("tests/fixtures/inventories/audit/h200_wrong.py", "h200-hmm"),
    "h200-count": ("tests/fixtures/inventories/audit/h200_wrong.py", "h200-count"),
}
CONCERNS = ("modules", "devices")  # what device-audit.sh wrote (write-plan-files.out)
SIZES = DEFAULT_SIZES  # what the real run used (the audit plugin's default --p2p-sizes)

# check -> ({real status: twin statuses}, why they differ). None today: the three the first
# run showed were the twin's, and fixed there (kernels without a module tree load no nouveau,
# twin/hwsim/modules.py in_tree; a twin of a host without Proxmox VE has neither
# proxmox-boot-tool nor pvesm, twin/pve/setup.py PROXMOX_TOOLS and twin/hardware.py).
DIFFERENCES: dict[str, tuple[dict[str, set[str]], str]] = {}


def recorded(report: str) -> dict[str, str]:
    data = json.loads((RUN / f"{report}.json").read_text())
    return {r["check"]: r["status"] for r in data["results"]}


def target(name: str, inventory: str, twin: TwinHandle) -> Target:
    """The inventory's host with its connection replaced by the twin's (as rehearse does)."""
    spec, data = load_inventory(ROOT / inventory)[name]
    data = {
        **data,
        "ssh_hostname": twin.address,
        "ssh_user": "root",
        "ssh_key": str(twin.key),
        "ssh_known_hosts_file": str(twin.known_hosts),
        "ssh_strict_host_key_checking": "yes",
    }
    return Target(name, spec, data, f"ssh://root@{twin.address}:22", inventory)


def put(twin: TwinHandle, path: str, text: str, mode: str) -> None:
    rc, _, err = twin.run(
        f"mkdir -p $(dirname {path}) && cat > {path} <<'GPUHOST_EOF'\n{text}GPUHOST_EOF\n"
        f"chmod {mode} {path}"
    )
    assert rc == 0, err


def write_plan_files(twin: TwinHandle) -> list[str]:
    """tools/write-plan-files.py inventory/h200.py h200 modules devices, over SSH."""
    t = target("h200", "inventory/h200.py", twin)
    host = read_host(t.name, t.spec, host_runner(t.name, t.data, t.url), None, SIZES, guests=False)
    assert host.context is not None, host.refused
    written = []
    for item in host.context.plan.files.values():
        if item.concern not in CONCERNS:
            continue
        if item.link is not None:
            assert (
                twin.run(f"mkdir -p $(dirname {item.path}); ln -sfn {item.link} {item.path}")[0]
                == 0
            )
        elif item.content is None:
            assert twin.run(f"rm -f {item.path}")[0] == 0
        else:
            put(twin, item.path, item.content, item.mode)
        written.append(f"{item.concern}: {item.path}")
    return written


@pytest.fixture(scope="module")
def h200x1(twin_fleet, tmp_path_factory) -> Iterator[TwinHandle]:
    tmp = tmp_path_factory.mktemp("agreement")
    data = profile_from_snapshot(read_snapshot(ROOT / CAPTURE), name="h200x1", source=CAPTURE)
    write_profile(data, tmp / "h200x1.yaml")
    (twin,) = twin_fleet.start(1, str(tmp / "h200x1.yaml"))
    try:
        written = write_plan_files(twin)
        expected = (RUN / "write-plan-files.out").read_text().splitlines()
        assert sorted(written) == sorted(expected)
        yield twin
    finally:
        twin_fleet.stop(twin)


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_the_twin_audits_as_the_real_machine(h200x1, name):
    inventory, report = HOSTS[name]
    t = target(name, inventory, h200x1)
    host = read_host(t.name, t.spec, host_runner(t.name, t.data, t.url), None, SIZES)
    got = {o.check.id: o for o in audit_all(host)}
    want = recorded(report)
    assert set(got) == set(want)
    differ = {}
    for check, status in want.items():
        twin_status = got[check].status
        known = DIFFERENCES.get(check)
        if known is not None and twin_status in known[0].get(status, set()):
            continue
        if twin_status != status:
            outcome = got[check]
            why = outcome.skipped or [f.found for f in outcome.findings]
            differ[check] = f"real {status}, twin {twin_status}: {why}"
    assert differ == {}, json.dumps(differ, indent=1)


# --- the plan: a twin made from a capture plans as the captured machine ----------------------


def twin_raw(twin: TwinHandle) -> dict[str, tuple[int, list[str]]]:
    """Every fact read from the twin in one command, as `gpuhost plan`'s live read does."""
    commands = combined_args()["commands"]
    rc, out, err = twin.run(Combined().command(commands), timeout=300)
    assert rc == 0, err
    return Combined().process(out.splitlines())


def plan_text(raw: dict, inventory: Path) -> str:
    name, (spec, _) = next(iter(load_inventory(inventory).items()))
    facts = parse_raw(raw)
    control = read_control(spec, facts, str(inventory))
    return render_plan(make_plan(name, spec, facts, str(inventory), control))


# Lines of the plan that differ between the captured machine and its twin: (side, pattern, why).
# The twin boots as the microVM does (twin/profile_boot.py loader none: no loader word on the
# command line, no /boot/grub, no ESP), so its trial boot is refused as "unsupported" like the
# machine's. What is left is h200x2's capture, taken before gpuhost read BootPath: its plan
# cannot know the boot path ("unknown"); its twin shows one (none: "unsupported").
PLAN_DIFFERENCES = (
    (
        "real",
        r"^trial boot .*refused \(unknown\)",
        "h200x2's capture predates the BootPath fact: the plan from it cannot know the boot path;"
        " its twin (loader none, from the Firecracker command line) has one",
    ),
    ("twin", r"^trial boot .*refused \(unsupported\)", "the same line on the twin"),
)


def same(twin: str, real: str) -> None:
    """The twin's plan is the real one, line by line, but for PLAN_DIFFERENCES."""
    unexplained = []
    for line in difflib.ndiff(real.strip().splitlines(), twin.strip().splitlines()):
        side = {"- ": "real", "+ ": "twin"}.get(line[:2])
        if side is None:
            continue
        if not any(side == s and re.search(p, line[2:]) for s, p, _ in PLAN_DIFFERENCES):
            unexplained.append(line)
    assert not unexplained, "\n".join(unexplained)


def started(twin_fleet, tmp: Path, capture: str, name: str) -> TwinHandle:
    data = profile_from_snapshot(read_snapshot(ROOT / capture), name=name, source=capture)
    write_profile(data, tmp / f"{name}.yaml")
    (twin,) = twin_fleet.start(1, str(tmp / f"{name}.yaml"))
    return twin


@pytest.mark.parametrize("machine", ["h200x1", "h200x2"])
def test_the_twin_plans_as_the_captured_machine(twin_fleet, tmp_path, h200x1, machine):
    """The twin's plan is the plan from its capture (`gpuhost plan --facts`), which
    tools/device-check.sh found equal to the live machine's plan (device-check/plan-live.txt,
    printed by the gpuhost of its day): for h200x2, which has no audit run recorded, and h200x1
    (its twin carries the files the audit run wrote: modules, devices)."""
    captured = ROOT / f"tests/fixtures/captures/{machine}"
    inventory = captured / "device-check/inventory.py"
    if machine == "h200x1":
        twin = h200x1
    else:
        twin = started(twin_fleet, tmp_path, f"{captured.relative_to(ROOT)}/facts", machine)
    try:
        got = plan_text(twin_raw(twin), inventory)
    finally:
        if twin is not h200x1:
            twin_fleet.stop(twin)
    same(got, plan_text(read_snapshot(captured / "facts"), inventory))
    if machine == "h200x2":  # the lines of the live plan today's plan still prints
        live = (captured / "device-check/plan-live.txt").read_text().splitlines()
        kept = [line for line in live if line.startswith(("0 ", "1 ", "boot loader", "options"))]
        kept += [line for line in live if line.startswith(("blacklist", "load at boot"))]
        assert len(kept) == 6 and set(kept) <= set(got.splitlines())


def test_the_microvm_kernel_loads_no_in_tree_module(h200x1):
    """What modules.loaded agrees on: the captured kernel has no /lib/modules tree
    (KernelFeatureFiles empty; h200x1-boot-raw/ls_modules.out), so its twin's modprobe finds no
    in-tree module, as modprobe(8) looks nowhere else; the driver's modules load as captured."""
    # and, like the machine (no Proxmox VE there), it has no Proxmox tools
    assert h200x1.run("command -v pvesm || command -v proxmox-boot-tool")[0] != 0
    rc, _, err = h200x1.run("modprobe nouveau")
    assert rc != 0 and "Module nouveau not found in directory /lib/modules/" in err
    loaded = [line.split()[0] for line in h200x1.run("cat /proc/modules")[1].splitlines()]
    assert sorted(loaded) == ["nvidia", "nvidia_uvm"]
