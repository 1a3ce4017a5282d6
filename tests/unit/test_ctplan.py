"""GPU container entries (gpuhost/plan/guests/containers.py): devN vs raw, live majors, ownership, refusals, and
the raw edit that touches only gpuhost's lines; the config backup helper."""

from __future__ import annotations

import base64
import hashlib

import pytest

from gpuhost.observe.containers import parse_container_states, parse_package_version
from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.guests.containers import (
    ALLOW_KEY,
    DeviceRule,
    dev_path,
    edit_raw,
    parse_rule,
    plan_containers,
    raw_lines,
    record_path,
    restart_marker,
)
from gpuhost.plan.make import make_plan
from gpuhost.pve.backup import backup_command, config_path
from gpuhost.spec.host import HostSpec
from tests.unit.hosts import kpro6

KPRO6 = {"kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "580.95.05"}}
NODES = (
    *(f"/dev/nvidia{i}" for i in range(6)),
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
)
BASE = "arch: amd64\nhostname: ct200\nostype: debian\nunprivileged: 1\n"


def facts(
    conf: str = BASE,
    record: str | None = None,
    pve: str = "ii  5.3.5",
    running: bool = False,
    uvm: int = 509,
    marker: bool = False,
) -> HostFacts:
    files = {"/etc/kernel/cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet pcie_aspm=off\n"}
    if record is not None:
        files[record_path(200)] = record
    if marker:
        files[restart_marker(200)] = ""
    lines = [f"F {p} {base64.b64encode(t.encode()).decode()}" for p, t in files.items()]
    devices = ["Character devices:", "195 nvidia", "195 nvidiactl", f"{uvm} nvidia-uvm"]
    status = "running" if running else "stopped"
    return kpro6(
        PveGuestConfigs=(0, ["==> /etc/pve/lxc/200.conf <==", *conf.splitlines()]),
        ConfigFiles=(0, lines),
        PveContainerVersion=(0, [pve] if pve else []),
        CharDevices=(0, devices),
        GuestStatuses=(
            0,
            [
                "==> lxc <==",
                "VMID       Status     Lock         Name",
                f"200 {status} ct200",
                "==> qemu <==",
            ],
        ),
        BootId=(0, ["11111111-2222-3333-4444-555555555555"]),
        LoadedModules=(0, []),
    )


def spec(devices: str = "devN", gpus: object = "rest") -> HostSpec:
    guest = {"kind": "lxc", "ctid": 200, "name": "ct200", "gpus": gpus, "devices": devices}
    vm = {"kind": "vm", "vmid": 129, "name": "vm129", "machine": "q35"}
    vm["gpus"] = ["0000:c1:00.0", "0000:e1:00.0"]
    return HostSpec.model_validate({**KPRO6, "guests": [vm, guest]})


def plan(spec_: HostSpec, facts_: HostFacts, rebooting: bool = False):
    problems: list[str] = []
    notes: list[str] = []
    found = plan_containers(spec_, facts_, {200: NODES}, rebooting, problems, notes)
    return found.get(200), problems, notes


def test_devn_entries_for_exactly_the_planned_nodes() -> None:
    ct, problems, _ = plan(spec(), facts())
    assert problems == []
    assert ct is not None and ct.mode == "devN"
    assert ct.dev_set == {f"dev{i}": f"{n},mode=0666" for i, n in enumerate(NODES)}
    assert ct.dev_delete == () and ct.raw_add == () and not ct.restart
    assert ct.record.splitlines()[0] == "dev0: /dev/nvidia0,mode=0666"


def test_devn_keeps_other_devices_and_takes_free_keys() -> None:
    conf = BASE + "dev0: /dev/dri/card0,gid=44\ndev2: /dev/ttyUSB0\n"
    ct, _, _ = plan(spec(), facts(conf))
    assert ct is not None
    assert "dev0" not in ct.dev_set and "dev2" not in ct.dev_set
    assert list(ct.dev_set)[:3] == ["dev1", "dev3", "dev4"]
    assert ct.dev_delete == ()


def test_raw_rules_are_per_node_at_the_live_majors() -> None:
    ct, problems, _ = plan(spec("raw"), facts(uvm=511))
    assert problems == [] and ct is not None
    rules = [line for line in ct.raw_add if line.startswith("lxc.cgroup2")]
    assert rules == [
        *(f"lxc.cgroup2.devices.allow: c 195:{i} rwm" for i in range(6)),
        "lxc.cgroup2.devices.allow: c 195:255 rwm",
        "lxc.cgroup2.devices.allow: c 511:0 rwm",
        "lxc.cgroup2.devices.allow: c 511:1 rwm",
    ]
    assert not any("*" in line for line in ct.raw_add)
    assert "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file" in (
        ct.raw_add
    )
    assert ct.dev_set == {}


def test_a_stale_recorded_major_is_replaced_and_the_container_restarts() -> None:
    stale = raw_lines(NODES, {"nvidia": 195, "nvidia-uvm": 238})
    assert stale is not None
    conf = BASE + "".join(f"{line}\n" for line in stale)
    ct, _, _ = plan(spec("raw"), facts(conf, record="".join(f"{x}\n" for x in stale), running=True))
    assert ct is not None
    assert ct.raw_remove == (
        "lxc.cgroup2.devices.allow: c 238:0 rwm",
        "lxc.cgroup2.devices.allow: c 238:1 rwm",
    )
    assert ct.raw_add == (
        "lxc.cgroup2.devices.allow: c 509:0 rwm",
        "lxc.cgroup2.devices.allow: c 509:1 rwm",
    )
    assert ct.restart


def test_converged_raw_and_devn_change_nothing() -> None:
    for mode in ("raw", "devN"):
        first, _, _ = plan(spec(mode), facts())
        assert first is not None
        conf = BASE + "".join(f"{k}: {v}\n" for k, v in first.dev_set.items())
        conf += "".join(f"{line}\n" for line in first.raw_add)
        ct, problems, _ = plan(spec(mode), facts(conf, record=first.record, running=True))
        assert problems == [] and ct is not None
        assert not ct.changes_config and not ct.restart, mode


def test_an_unfinished_restart_is_done_next_time() -> None:
    first, _, _ = plan(spec("raw"), facts())
    assert first is not None
    conf = BASE + "".join(f"{line}\n" for line in first.raw_add)
    ct, _, _ = plan(spec("raw"), facts(conf, record=first.record, running=True, marker=True))
    assert ct is not None and not ct.changes_config and ct.restart
    # devN set on a running container waits in [pve:pending]: that alone means a restart
    pending = (
        BASE
        + "\n[pve:pending]\n"
        + "".join(f"{k}: {v}\n" for k, v in plan(spec(), facts())[0].dev_set.items())
    )
    ct, _, _ = plan(spec(), facts(pending, running=True))
    assert ct is not None and not ct.changes_config and ct.restart


def test_switching_raw_to_devn_removes_the_raw_lines() -> None:
    raw, _, _ = plan(spec("raw"), facts())
    assert raw is not None
    conf = BASE + "".join(f"{line}\n" for line in raw.raw_add)
    ct, _, _ = plan(spec("devN"), facts(conf, record=raw.record))
    assert ct is not None
    assert ct.raw_remove == raw.raw_add and len(ct.dev_set) == len(NODES)


def test_gpus_taken_away_remove_only_gpuhosts_entries() -> None:
    first, _, _ = plan(spec(), facts())
    assert first is not None
    conf = BASE + "dev0: /dev/dri/card0\n"
    conf += "".join(f"dev{i + 1}: {v}\n" for i, v in enumerate(first.dev_set.values()))
    record = "".join(f"dev{i + 1}: {v}\n" for i, v in enumerate(first.dev_set.values()))
    problems: list[str] = []
    found = plan_containers(spec(gpus=[]), facts(conf, record=record), {}, False, problems, [])
    assert found[200].dev_delete == tuple(f"dev{i}" for i in range(1, 10))
    assert found[200].record == ""


def test_foreign_nvidia_entries_are_named_and_left_alone() -> None:
    conf = BASE + "lxc.cgroup2.devices.allow: c 195:* rwm\ndev7: /dev/nvidia7\n"
    ct, problems, notes = plan(spec(), facts(conf))
    assert problems == [] and ct is not None
    assert "dev7" not in ct.dev_set and "dev7" not in ct.dev_delete
    assert any("c 195:* rwm" in n and "dev7: /dev/nvidia7" in n for n in notes)


def test_devn_is_refused_without_pve_container_5_0_7() -> None:
    for found in ("ii  5.0.6", "", "ii  4.4-4"):
        ct, problems, _ = plan(spec(), facts(pve=found))
        assert ct is None
        assert len(problems) == 1 and "guests[1].devices = 'devN'" in problems[0]
        assert "set devices: raw for ct200" in problems[0]
    ct, problems, _ = plan(spec(), facts(pve="ii  5.0.7"))
    assert problems == [] and ct is not None
    ct, problems, _ = plan(spec("raw"), facts(pve="ii  5.0.6"))
    assert problems == [] and ct is not None


def test_the_refusal_stops_the_whole_plan() -> None:
    from gpuhost.plan.make import PlanError

    with pytest.raises(PlanError, match="devices = 'devN'"):
        make_plan("kpro6", spec(), facts(pve="ii  5.0.6"))


def test_raw_waits_for_the_boot_that_sets_the_majors() -> None:
    ct, _, notes = plan(spec("raw"), facts(), rebooting=True)
    assert ct is None and any("nvidia-uvm's major changes at boot" in n for n in notes)
    ct, _, _ = plan(spec(), facts(), rebooting=True)  # devN do not depend on majors
    assert ct is not None and ct.dev_set


def test_devn_waits_for_the_driver_that_makes_the_nodes() -> None:
    without_uvm = facts()
    without_uvm.char_devices.pop("nvidia-uvm")
    ct, problems, notes = plan(spec(), without_uvm)
    assert ct is None and problems == [] and any("not loaded" in n for n in notes)
    ct, _, _ = plan(spec(), without_uvm, rebooting=True)  # the reboot loads them first
    assert ct is not None


def test_a_locked_container_is_refused() -> None:
    ct, problems, _ = plan(spec(), facts(BASE + "lock: backup\n"))
    assert ct is None and "is locked (backup)" in problems[0]


def test_edit_raw_touches_only_its_lines() -> None:
    text = (
        "#my container%3A keep\n"
        "arch: amd64\n"
        "lxc.cgroup2.devices.allow = c 238:0 rwm\n"
        "lxc.apparmor.profile: unconfined\n"
        "lxc.mount.entry: /srv srv none bind 0 0\n"
        "\n"
        "[pve:pending]\n"
        "memory: 1024\n"
        "\n"
        "[snap1]\n"
        "lxc.cgroup2.devices.allow: c 238:0 rwm\n"
    )
    out = edit_raw(
        text,
        ("lxc.cgroup2.devices.allow: c 238:0 rwm",),
        ("lxc.cgroup2.devices.allow: c 509:0 rwm",),
    )
    assert out == (
        "#my container%3A keep\n"
        "arch: amd64\n"
        "lxc.apparmor.profile: unconfined\n"
        "lxc.mount.entry: /srv srv none bind 0 0\n"
        "lxc.cgroup2.devices.allow: c 509:0 rwm\n"
        "\n"
        "[pve:pending]\n"
        "memory: 1024\n"
        "\n"
        "[snap1]\n"
        "lxc.cgroup2.devices.allow: c 238:0 rwm\n"
    )
    assert edit_raw("arch: amd64", (), ("lxc.x: y",)) == "arch: amd64\nlxc.x: y\n"


def test_container_states_and_package_version_parse() -> None:
    conf = "arch: amd64\n"
    lines = [
        "==> ct 200 <==",
        f"conf {base64.b64encode(conf.encode()).decode()}",
        "status status: running",
        "lib /usr/lib/x86_64-linux-gnu/libcuda.so.595.71.05",
        "lib /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.595.71.05",
        "==> ct 201 <==",
    ]
    states = parse_container_states(lines)
    assert states[200].digest == hashlib.sha1(conf.encode()).hexdigest()
    assert states[200].status == "running"
    assert states[200].userspace == {"libcuda": ["595.71.05"], "libnvidia-ml": ["595.71.05"]}
    assert states[201].text is None
    assert parse_package_version(["ii  5.3.5"]).version == "5.3.5"
    assert parse_package_version(["rc  5.3.5"]).version is None
    assert parse_package_version([]).version is None


def test_backups_name_kind_id_and_time_and_keep_a_bounded_number() -> None:
    assert config_path("qemu", 129) == "/etc/pve/qemu-server/129.conf"
    command = backup_command("lxc", 200, keep=3)
    assert "cp -p /etc/pve/lxc/200.conf" in command
    assert "/var/lib/gpuhost/backups/lxc-200-$(date -u +%Y%m%dT%H%M%SZ).conf" in command
    assert "head -n -3" in command
    for kind, vmid in (("lxc; rm -rf /", 200), ("lxc", True), ("lxc", 7), ("vm", 200)):
        with pytest.raises(ValueError):
            config_path(kind, vmid)  # type: ignore[arg-type]


def test_the_raw_lines_the_plan_writes_read_back_as_its_grants() -> None:
    """One reader of device rules and devN entries for the plan and the audit: what the plan
    writes reads back as exactly the nodes it grants."""
    nodes = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")
    majors = {"nvidia": 195, "nvidiactl": 195, "nvidia-uvm": 509}
    lines = raw_lines(nodes, majors)
    assert lines is not None
    rules = [
        parse_rule(line.split(":", 1)[1])
        for line in lines
        if ALLOW_KEY.fullmatch(line.split(":", 1)[0])
    ]
    assert rules == [
        DeviceRule("c", 195, "0"),
        DeviceRule("c", 195, "255"),
        DeviceRule("c", 509, "0"),
    ]
    assert parse_rule("a") == DeviceRule("a", None, "*")
    assert parse_rule("c *:* rwm") == DeviceRule("c", None, "*")
    assert dev_path("mode=0666,path=/dev/nvidia3") == "/dev/nvidia3"
