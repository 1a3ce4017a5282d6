"""GPU containers on a kpro6 twin, through the real pyinfra CLI: container 200 gets exactly its
6 GPUs (devN entries, then raw lines at the live majors), the real LXC container opens them and
CUDA inside sees 6; a reboot that moves nvidia-uvm's major leaves devN working and makes the
audit name the stale raw rule, which the next run fixes; the container's NVIDIA userspace is
brought to the host driver's version with the installer run inside; second runs change nothing.

VM 129's GPUs are in the spec (so 'rest' is 6 GPUs) but its side (vfio binding, hostpci) is not
checked here: only the host's device checks and the container's (ct.*) are asserted.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, deploy, inventory, with_driver
from tests.e2e.guests import SPEC, VERSION, audit
from tests.e2e.test_driver_install import TREE
from twin.hwtesting import ModuleCache
from twin.nvinstaller import build_installer
from twin.pytest_plugin import PVE_DIRS, TwinHandle

CT = 200
HOOK = "local:snippets/gpuhost-ready"  # gpuhost's hookscript (gpuhost/paths.py)
OLD = "580.95.05"  # the driver the host runs until the driver change (VERSION: 595.71.05)
CONF = f"/etc/pve/lxc/{CT}.conf"
# The user's own entries, which gpuhost must leave alone: a device and a raw mount of theirs.
OWN = ("dev9: /dev/null", "lxc.mount.entry: /srv srv none bind,optional,create=dir")
BASE = (
    "arch: amd64\ndev9: /dev/null\nhostname: ct200\nonboot: 1\nostype: debian\nunprivileged: 1\n"
    "lxc.mount.entry: /srv srv none bind,optional,create=dir\n"
)
NODES = [f"/dev/nvidia{i}" for i in range(6)] + [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
]
# The probe a CUDA program would make: each node's numbers, and what open() answers (the device
# cgroup says EPERM for a node not granted; with no real driver behind a granted one, ENXIO).
PROBE = """
import errno, glob, os
for p in sorted(glob.glob('/dev/nvidia*')):
    st = os.stat(p)
    try:
        os.close(os.open(p, os.O_RDWR)); how = 'open'
    except OSError as e:
        how = 'open' if e.errno in (errno.ENXIO, errno.ENODEV) else errno.errorcode[e.errno]
    print(p, os.major(st.st_rdev), os.minor(st.st_rdev), how)
"""


def spec(devices: str, **driver: object) -> dict:
    wanted = json.loads(json.dumps(SPEC))
    wanted["guests"][1]["devices"] = devices
    wanted["driver"].update(driver)
    return wanted


def sh(twin: TwinHandle, command: str) -> str:
    rc, out, err = twin.run(command)
    assert rc == 0, f"{command}: {out}{err}"
    return out


def inside(twin: TwinHandle, command: str) -> tuple[int, str, str]:
    return twin.run(f"pct exec {CT} -- sh -c {shlex.quote(command)}")


def nodes_inside(twin: TwinHandle) -> dict[str, tuple[int, int, str]]:
    rc, out, err = inside(twin, f"python3 -c {shlex.quote(PROBE)}")
    assert rc == 0, out + err
    found = {}
    for line in out.splitlines():
        path, major, minor, how = line.split()
        found[path] = (int(major), int(minor), how)
    return found


def majors(twin: TwinHandle) -> dict[str, int]:
    lines = (twin.root / "proc/devices").read_text().split("Block devices:")[0].splitlines()
    return {w[1]: int(w[0]) for w in (ln.split() for ln in lines) if len(w) == 2 and w[0].isdigit()}


def expected_nodes(twin: TwinHandle) -> dict[str, tuple[int, int, str]]:
    uvm = majors(twin)["nvidia-uvm"]
    found = {f"/dev/nvidia{i}": (195, i, "open") for i in range(6)}
    found["/dev/nvidiactl"] = (195, 255, "open")
    found["/dev/nvidia-uvm"] = (uvm, 0, "open")
    found["/dev/nvidia-uvm-tools"] = (uvm, 1, "open")
    return found


def container_failures(twin: TwinHandle, inv: Path) -> dict[str, list[str]]:
    """The audit's failed checks about devices and the container (the VM's side left out)."""
    failed = audit(twin, inv)
    return {k: v for k, v in failed.items() if k.startswith(("ct.", "devices."))}


def config(twin: TwinHandle) -> str:
    return (twin.root / "etc/pve/lxc" / f"{CT}.conf").read_text()


@pytest.fixture(scope="module")
def kpro6(twin_fleet, tmp_path_factory) -> Iterator[tuple[TwinHandle, Path]]:
    """A deployed kpro6 twin (driver OLD loaded, its boot converged) with CT 200 created without
    any GPU entry, running, with the host driver's userspace inside."""
    (twin,) = twin_fleet.start(1, "kpro6")
    tmp = tmp_path_factory.mktemp("containers")
    try:
        with_driver(twin, ModuleCache(), OLD)
        inv = inventory(tmp / "kpro6.py", twin, spec("devN"))
        first = deploy(inv)
        assert first.rc == 0, first.output[-3000:]
        sh(twin, PVE_DIRS)
        sh(twin, f"cat > {CONF} <<'EOF'\n{BASE}EOF")
        sh(twin, f"pct start {CT}")
        # The operator's install of that driver's userspace inside, by hand: NVIDIA's .run
        # (the twin's stand-in) pushed in and run with --no-kernel-modules.
        old = build_installer(OLD, tmp / "old")
        shutil.copy(old, twin.root / "root" / old.name)
        sh(twin, f"pct push {CT} /root/{old.name} /root/{old.name} --perms 0700")
        sh(twin, f"pct exec {CT} -- sh /root/{old.name} --silent --no-kernel-modules")
        yield twin, tmp
    finally:
        twin_fleet.stop(twin)


def test_devn_gives_exactly_its_gpus_and_survives_a_major_change(kpro6):
    twin, tmp = kpro6
    inv = inventory(tmp / "devn.py", twin, spec("devN"))
    assert nodes_inside(twin) == {}  # nothing granted yet
    done = deploy(inv)
    assert done.rc == 0, done.output[-3000:]
    conf = config(twin)
    devs = [line for line in conf.splitlines() if line.startswith("dev") and line not in OWN]
    assert all(line in conf.splitlines() for line in OWN)
    assert devs == sorted(
        (f"dev{i}: {n},mode=0666" for i, n in enumerate(NODES)), key=lambda s: s.split(":")[0]
    )
    assert "lxc.cgroup2" not in conf and "[pve:pending]" not in conf  # applied by the restart
    assert nodes_inside(twin) == expected_nodes(twin)
    assert sh(twin, f"pct status {CT}").strip() == "status: running"
    backups = sh(twin, "ls /var/lib/gpuhost/backups").split()  # the hookscript's, the devN's
    assert len(backups) in (1, 2) and all(b.startswith(f"lxc-{CT}-") for b in backups)
    assert sh(twin, f"cat /var/lib/gpuhost/backups/{backups[0]}") == BASE
    assert f"hookscript: {HOOK}" in conf.splitlines()  # the readiness check (test_readiness)
    assert container_failures(twin, tmp / "devn.py") == {}

    again = deploy(inv)
    assert again.rc == 0 and not again.changed, again.output[-3000:]

    before = majors(twin)["nvidia-uvm"]
    twin.reboot()
    guests_started(twin)
    assert majors(twin)["nvidia-uvm"] != before
    sh(twin, f"pct status {CT} | grep -qx 'status: running'")  # onboot: 1
    assert nodes_inside(twin) == expected_nodes(twin)  # Proxmox resolved the live majors
    assert container_failures(twin, tmp / "devn.py") == {}
    after = deploy(inv)
    assert after.rc == 0 and not after.changed, after.output[-3000:]


def test_raw_lines_at_the_live_majors_and_a_rerun_fixes_a_stale_one(kpro6):
    twin, tmp = kpro6
    inv = inventory(tmp / "raw.py", twin, spec("raw"))
    done = deploy(inv)
    assert done.rc == 0, done.output[-3000:]
    conf = config(twin)
    uvm = majors(twin)["nvidia-uvm"]
    gone = [ln for ln in conf.splitlines() if ln.startswith("dev") and ln not in OWN]
    assert gone == [] and all(line in conf.splitlines() for line in OWN)  # devN removed
    rules = [line for line in conf.splitlines() if line.startswith("lxc.cgroup2")]
    assert rules == [
        *(f"lxc.cgroup2.devices.allow: c 195:{i} rwm" for i in range(6)),
        "lxc.cgroup2.devices.allow: c 195:255 rwm",
        f"lxc.cgroup2.devices.allow: c {uvm}:0 rwm",
        f"lxc.cgroup2.devices.allow: c {uvm}:1 rwm",
    ]
    mounts = [ln for ln in conf.splitlines() if ln.startswith("lxc.mount.entry") and ln not in OWN]
    assert mounts == [f"lxc.mount.entry: {n} {n[1:]} none bind,optional,create=file" for n in NODES]
    assert conf.replace(f"hookscript: {HOOK}\n", "").startswith(BASE)  # the user's entries kept
    assert nodes_inside(twin) == expected_nodes(twin)
    assert container_failures(twin, tmp / "raw.py") == {}
    again = deploy(inv)
    assert again.rc == 0 and not again.changed, again.output[-3000:]

    twin.reboot()  # nvidia-uvm gets another major: the raw rule is stale
    now = majors(twin)["nvidia-uvm"]
    assert now != uvm
    # gpuhost's readiness check held the container back at its onboot start, saying why.
    guests_started(twin)
    assert sh(twin, f"pct status {CT}").strip() == "status: stopped"
    held = sh(twin, f"cat /var/lib/gpuhost/held-{CT}")
    assert f"raw rule grants /dev/nvidia-uvm as major {uvm}, but nvidia-uvm is major {now}" in held
    failed = container_failures(twin, tmp / "raw.py")
    rules = failed.get(f"ct.device_rules/ct{CT}", [])
    # the old major is named stale when no device has it now; either way uvm's nodes are not
    # granted at the live major
    assert rules.count("not granted") == 2, failed
    assert all(f == "not granted" or "stale (dynamic) nvidia-uvm" in f for f in rules), failed
    fixed = deploy(inv)  # the rules at the live majors, then the held container started
    assert fixed.rc == 0, fixed.output[-3000:]
    assert f"CT {CT}: start it (held back at its start)" in fixed.output
    assert sh(twin, f"pct status {CT}").strip() == "status: running"
    assert not (twin.root / f"var/lib/gpuhost/held-{CT}").exists()
    assert f"lxc.cgroup2.devices.allow: c {now}:0 rwm" in config(twin)
    assert f"c {uvm}:0 rwm" not in config(twin)
    assert nodes_inside(twin) == expected_nodes(twin)
    assert container_failures(twin, tmp / "raw.py") == {}
    assert not deploy(inv).changed


def test_a_host_driver_change_brings_the_container_userspace_along(kpro6):
    twin, tmp = kpro6
    lib = "ls /usr/lib/x86_64-linux-gnu/ | grep -E 'lib(cuda|nvidia-ml).so.5'"
    assert inside(twin, lib)[1].split() == [f"libcuda.so.{OLD}", f"libnvidia-ml.so.{OLD}"]
    installer = build_installer(VERSION, tmp / "nvidia")
    source = {"tree": str(TREE), "store": str(tmp / "store"), "installer": str(installer)}
    # devN: with raw rules the reboot below would leave a stale major, which holds the container
    # back until a run rewrites it (test above); here it comes back on its old userspace.
    inv = inventory(tmp / "us.py", twin, spec("devN", source=source))
    done = deploy(inv)  # the host gets VERSION's modules and userspace; OLD stays loaded
    assert done.rc == 0, done.output[-4000:]
    assert f"follows the boot that loads driver {VERSION}" in done.output
    assert inside(twin, lib)[1].split() == [f"libcuda.so.{OLD}", f"libnvidia-ml.so.{OLD}"]

    # The operator removes the old driver's modules (the DKMS build gpuhost did not make) and
    # reboots into the new one; the container comes back on its old userspace.
    sh(twin, "rm -rf /lib/modules/$(uname -r)/updates/dkms && depmod -a")
    twin.reboot()
    guests_started(twin)  # pve-guests starts the container after the reboot returns
    assert f"  {VERSION}  " in (twin.root / "proc/driver/nvidia/version").read_text()
    rc, out, _ = inside(twin, "nvidia-smi -L")
    assert rc == 18 and "Driver/library version mismatch" in out, out
    failed = container_failures(twin, tmp / "us.py")
    assert failed.get(f"ct.userspace/ct{CT}") == [OLD], failed

    done = deploy(inv)
    assert done.rc == 0, done.output[-4000:]
    assert f"CT {CT}: NVIDIA userspace libcuda {OLD}, libnvidia-ml {OLD} -> {VERSION}" in (
        done.output
    )
    rc, out, err = inside(twin, lib)
    assert out.split() == [f"libcuda.so.{VERSION}", f"libnvidia-ml.so.{VERSION}"], out + err
    query = "nvidia-smi --query-gpu=index,pci.bus_id,driver_version --format=csv,noheader"
    rc, out, err = inside(twin, query)
    assert rc == 0, out + err
    rows = [line.split(", ") for line in out.splitlines()]
    assert [r[1] for r in rows] == [
        "00000000:01:00.0",
        "00000000:21:00.0",
        "00000000:41:00.0",
        "00000000:61:00.0",
        "00000000:81:00.0",
        "00000000:A1:00.0",
    ]
    assert {r[2] for r in rows} == {VERSION}
    assert not (twin.root / "var/lib/gpuhost" / f"ct-{CT}-pending-userspace").exists()
    assert inside(twin, f"ls /var/lib/gpuhost/NVIDIA-Linux-x86_64-{VERSION}.run")[0] != 0
    assert container_failures(twin, tmp / "us.py") == {}
    again = deploy(inv)
    assert again.rc == 0 and not again.changed, again.output[-3000:]


def test_devn_on_a_proxmox_without_it_is_refused_before_anything_changes(kpro6):
    twin, tmp = kpro6
    status = twin.root / "var/lib/dpkg/status"
    text = status.read_text()
    status.write_text(text.replace("Version: 5.3.5", "Version: 5.0.6"))
    try:
        before = config(twin)
        done = deploy(inventory(tmp / "old.py", twin, spec("devN")))
        assert done.rc != 0
        assert "guests[1].devices = 'devN', but this host has pve-container 5.0.6" in done.output
        assert "set devices: raw for ct200" in done.output
        assert config(twin) == before
    finally:
        status.write_text(text)


READY = "/var/lib/vz/snippets/gpuhost-ready"
TIMING = f"""
import statistics, subprocess, time
runs = []
for _ in range(20):
    t = time.perf_counter()
    subprocess.run(["{READY}", "{CT}", "pre-start"], check=True)
    runs.append((time.perf_counter() - t) * 1000)
print(f"{{statistics.median(runs):.1f}} {{max(runs):.1f}}")
"""
MINE = '#!/bin/sh\necho "$1 $2" >> /root/mine.log\n'
CT201 = "arch: amd64\nhostname: ct201\nonboot: 1\nostype: debian\nunprivileged: 1\n"


def guests_started(twin: TwinHandle, timeout: float = 90.0) -> None:
    """Wait until pve-guests.service has started the onboot guests (twin/supervisor.py)."""
    deadline = time.monotonic() + timeout
    while twin.run("systemctl is-active pve-guests.service")[1].strip() == "activating":
        assert time.monotonic() < deadline, "pve-guests.service still starting the guests"
        time.sleep(0.5)


def tasks_of(twin: TwinHandle) -> dict[str, dict]:
    """The twin's task records (twin/pve/tasks.py), by UPID."""
    found = {}
    for path in (twin.root / "run/gpuhost-twin/tasks").glob("*.json"):
        task = json.loads(path.read_text())
        found[task.get("upid", path.stem)] = task
    return found


def test_a_gpu_guest_starts_only_when_its_gpus_are_ready(kpro6):
    """gpuhost's hookscript (files/gpuhost-ready): a container whose node is missing is held
    back with the reason in its start task's log while another guest starts, a hand-made
    `pct start` gets the same answer, the run after the fix starts it, and the user's own
    hookscript runs for its phases."""
    twin, tmp = kpro6
    inv = tmp / "us.py"  # the last test's: converged on VERSION, devN entries
    timing = sh(twin, f"python3 -c {shlex.quote(TIMING)}").split()
    print(f"readiness check when ready, in the twin: median {timing[0]} ms, max {timing[1]} ms")
    sh(twin, f"mkdir -p /var/lib/vz/snippets && printf %s {shlex.quote(MINE)} > "
             "/var/lib/vz/snippets/mine.sh && chmod 755 /var/lib/vz/snippets/mine.sh")  # fmt: skip
    sh(twin, f"pct set {CT} --hookscript local:snippets/mine.sh")  # the user's own
    sh(twin, f"cat > /etc/pve/lxc/201.conf <<'EOF'\n{CT201}EOF")  # a guest without GPUs
    done = deploy(inv)
    assert done.rc == 0, done.output[-3000:]
    assert f"hookscript: {HOOK}" in config(twin).splitlines()
    contract = json.loads((twin.root / f"etc/gpuhost/ready/{CT}.json").read_text())
    assert contract["chain"] == {
        "volid": "local:snippets/mine.sh",
        "path": "/var/lib/vz/snippets/mine.sh",
    }
    assert (twin.root / "etc/pve/lxc/201.conf").read_text() == CT201  # never touched
    assert not deploy(inv).changed

    sh(twin, f"pct stop {CT} && rm -f /root/mine.log /dev/nvidia-uvm")
    twin.run("pvesh create /nodes/localhost/startall")  # what pve-guests.service runs at boot
    assert sh(twin, "pct status 201").strip() == "status: running"
    assert sh(twin, f"pct status {CT}").strip() == "status: stopped"
    why = (
        f"gpuhost-ready: CT {CT} (ct200) not started: /dev/nvidia-uvm is missing; fix: "
        f"systemctl restart gpuhost-nvidia-devices.service (it makes the nodes), then pct start {CT}"
    )
    error = (
        f"hookscript error for {CT} on pre-start: command '{READY} {CT} pre-start' failed: "
        "exit code 1"
    )
    records = tasks_of(twin).values()
    (start,) = [
        t for t in records if f":vzstart:{CT}:" in str(t["upid"]) and t["exitstatus"] != "OK"
    ]
    assert start["exitstatus"] == error and why in start["log"], start
    (startall,) = [t for t in records if ":startall:" in str(t.get("upid"))]
    assert f"WARN: Starting CT {CT} failed: {error}" in startall["log"], startall
    assert not (twin.root / "root/mine.log").exists()  # gpuhost refused before the user's ran

    rc, out, err = twin.run(f"pct start {CT}")  # by hand: the same check, the same answer
    assert rc == 255 and why in out and error in err, out + err
    sh(twin, "systemctl restart gpuhost-nvidia-devices.service")  # the fix the line names
    fixed = deploy(inv)  # starts the guest the check held back in this boot
    assert fixed.rc == 0, fixed.output[-3000:]
    assert f"CT {CT}: start it (held back at its start)" in fixed.output
    assert sh(twin, f"pct status {CT}").strip() == "status: running"
    assert sh(twin, "cat /root/mine.log") == f"{CT} pre-start\n{CT} post-start\n"
    assert not deploy(inv).changed
    sh(twin, "pct stop 201 && rm /etc/pve/lxc/201.conf")


def test_the_containers_guide_names_the_restore_path():
    text = (ROOT / "docs/guides/containers.md").read_text()
    assert "/var/lib/gpuhost/backups/lxc-200-" in text
