"""/etc/pve guest configs: Proxmox's parser/writer rules (docs/reference/formats.md §1, §3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.twin.pve_helpers import FIXTURES, fake_node, make_root, write_conf
from twin.pve import config as cfg
from twin.pve import lxc_devices
from twin.pve import options as opts
from twin.pve.schema import FormatError, PveError, parse_property_string


def roundtrip(kind: str, raw: str) -> str:
    return cfg.write_config(cfg.parse_config(kind, 100, raw))


@pytest.mark.parametrize("name", ["pve-container-commit-101.conf", "pve-container-delete-203.conf"])
def test_proxmox_written_lxc_configs_roundtrip_byte_identical(name: str) -> None:
    # Written by pve-container's own writer (its test suite's expected files).
    raw = (FIXTURES / name).read_text()
    conf = cfg.parse_config("lxc", 101, raw)
    assert conf.warnings == []
    assert cfg.write_config(conf) == raw


def test_snapshot_sections_keep_snapstate_and_description() -> None:
    conf = cfg.parse_config("lxc", 203, (FIXTURES / "pve-container-delete-203.conf").read_text())
    snap = conf.snapshots["test"]
    assert snap.values["snapstate"] == "delete"
    assert snap.description == "test comment\n"
    assert snap.values["unused0"] == "local:snapshotable-disk-1"
    assert conf.main.values["parent"] == "test"


def test_gpu_container_sections_raw_keys_and_writer_order() -> None:
    raw = (FIXTURES / "lxc-gpu-200.conf").read_text()
    conf = cfg.parse_config("lxc", 200, raw)
    assert conf.warnings == []
    assert conf.main.description == "inference container: GPUs 0-1\nsecond line\n"
    assert conf.main.lxc == [
        ("lxc.cgroup2.devices.allow", "c 195:* rwm"),
        ("lxc.cgroup2.devices.allow", "c 509:* rwm"),  # written with " = " in the file
        ("lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"),
        ("lxc.mount.entry", "/dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir"),
    ]
    assert conf.pending.values == {"dev3": "/dev/nvidia1", "delete": "dev10"}
    assert conf.snapshots["before-driver-upgrade"].values["snaptime"] == "1767225600"
    # the writer: raw keys always as "key: value"; pending keys sorted ("delete" < "dev3")
    expected = raw.replace("allow = c 509", "allow: c 509")
    expected = expected.replace(
        "dev3: /dev/nvidia1\ndelete: dev10\n", "delete: dev10\ndev3: /dev/nvidia1\n"
    )
    assert cfg.write_config(conf) == expected
    assert roundtrip("lxc", expected) == expected


def test_writer_sorts_keys_lexically_dev10_before_dev2() -> None:
    conf = cfg.GuestConfig(kind="lxc", vmid=101)
    for i in (2, 10, 0, 1):
        conf.main.values[f"dev{i}"] = f"/dev/nvidia{i}"
    conf.main.values["arch"] = "amd64"
    conf.main.lxc.append(("lxc.cgroup2.devices.allow", "c 195:* rwm"))
    conf.main.description = "a: b\nc"
    assert cfg.write_config(conf) == (
        "#a%3A b\n#c\n"
        "arch: amd64\ndev0: /dev/nvidia0\ndev1: /dev/nvidia1\ndev10: /dev/nvidia10\n"
        "dev2: /dev/nvidia2\nlxc.cgroup2.devices.allow: c 195:* rwm\n"
    )


def test_qemu_config_from_qemu_server_tests() -> None:
    raw = (FIXTURES / "qemu-server-q35-linux-hostpci.conf").read_text()
    conf = cfg.parse_config("qemu", 100, raw)
    assert conf.warnings == []
    assert conf.main.description == " TEST: Config with q35, NUMA, hostpci passthrough, EFI & Linux"
    assert conf.main.values["hostpci4"] == "d0:17.0,pcie=1,rombar=0"
    written = cfg.write_config(conf)
    # Proxmox's writer escapes ':' in descriptions (PVE::Tools::encode_text)
    assert written == raw.replace("# TEST: Config", "# TEST%3A Config")
    assert roundtrip("qemu", written) == written


def test_qemu_pending_section_is_PENDING() -> None:
    conf = cfg.parse_config("qemu", 129, "cores: 4\n\n[PENDING]\nhostpci0: 0000:c1:00,pcie=1\n")
    assert conf.pending.values == {"hostpci0": "0000:c1:00,pcie=1"}
    assert cfg.write_config(conf).endswith("\n[PENDING]\nhostpci0: 0000:c1:00,pcie=1\n")


def test_parser_warnings_use_proxmox_messages() -> None:
    raw = (
        "arch: amd64\nfoo: bar\nonboot: maybe\nlxc.rootfs.path: /x\nlxc.bogus.key: 1\n"
        "delete: dev0\nthis is not a line\nlxc.aa_profile: unconfined\n"
    )
    conf = cfg.parse_config("lxc", 101, raw)
    assert conf.warnings == [
        "vm 101 - unable to parse value of 'foo' - unknown setting 'foo'",
        "vm 101 - unable to parse value of 'onboot' - type check ('boolean') failed - got 'maybe'",
        "vm 101 - lxc.rootfs.path: lxc.rootfs.path is auto generated from rootfs",
        "vm 101 - unable to parse config: lxc.bogus.key: 1",
        "vm 101 - property 'delete' is only allowed in [pve:pending]",
        "vm 101 - unable to parse config: this is not a line",
        "vm 101 - lxc.aa_profile is deprecated and was renamed to lxc.apparmor.profile",
    ]
    # pve-container keeps a value it could not parse; qemu-server drops it
    assert conf.main.values["foo"] == "bar"
    assert [k for k, _ in conf.main.lxc] == ["lxc.aa_profile"]
    assert "foo" not in cfg.parse_config("qemu", 100, "foo: bar\n").main.values


def test_booleans_and_integers_are_normalised_like_check_type() -> None:
    conf = cfg.parse_config("lxc", 101, "onboot: yes\nmemory: 0042\nunprivileged: off\n")
    assert conf.main.values == {"onboot": "1", "memory": "42", "unprivileged": "0"}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("/dev/nvidia0,mode=999", "dev0.mode: value does not match the regex pattern"),
        (
            "/dev/../etc/shadow",
            "dev0.path: invalid format - /dev/../etc/shadow is not a valid device path",
        ),
        ("/tmp/x", "dev0.path: invalid format - /tmp/x is not a valid device path"),
        ("/dev/nvidia0,gid=-1", "dev0.gid: value must have a minimum value of 0"),
        ("/dev/nvidia0,gid=video", "dev0.gid: type check ('integer') failed - got 'video'"),
        ("/dev/nvidia0,color=red", "invalid key in comma-separated list property: color"),
        ("/dev/nvidia0,/dev/nvidia1", "duplicate key in comma-separated list property: path"),
    ],
)
def test_dev_format_errors(value: str, error: str) -> None:
    with pytest.raises(FormatError) as exc:
        parse_property_string(opts.DEV_FMT, value, "dev0")
    assert error in str(exc.value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("0000:01:00", True),
        ("0000:01:00.0;0000:01:00.1", True),
        ("01:00.0,pcie=1,x-vga=1", True),
        ("0000:C1:00", False),  # lowercase only
        ("0000:01:00,pcie=yes", True),  # booleans parse like Proxmox's parse_boolean
        ("0000:01:00,rombar=2", False),
        ("mapping=gpu0", True),
    ],
)
def test_hostpci_format(value: str, ok: bool) -> None:
    if ok:
        parse_property_string(opts.HOSTPCI_FMT, value)
    else:
        with pytest.raises(FormatError):
            parse_property_string(opts.HOSTPCI_FMT, value)


@pytest.mark.parametrize("machine", ["q35", "pc-q35-8.1", "pc-q35-8.1+pve0", "pc", "pc-i440fx-9.2"])
def test_machine_types_accepted(machine: str) -> None:
    parse_property_string(opts.MACHINE_FMT, machine)


def test_read_lxc_gives_devices_and_raw_keys(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    write_conf(root, "lxc", 200, (FIXTURES / "lxc-gpu-200.conf").read_text())
    conf = lxc_devices.read_lxc(root, 200)
    assert [d.key for d in conf.devices] == ["dev0", "dev1", "dev2", "dev10"]  # numeric order
    assert conf.devices[0] == lxc_devices.LxcDevice("dev0", "/dev/nvidia0", None, 0, 44, False)
    assert conf.devices[2].deny_write is True
    assert conf.hostname == "ct200" and conf.unprivileged and conf.onboot
    assert conf.raw[1] == ("lxc.cgroup2.devices.allow", "c 509:* rwm")
    assert conf.pending == {"dev3": "/dev/nvidia1", "delete": "dev10"}
    # the node-name symlinks of pmxcfs: /etc/pve/lxc -> nodes/<node>/lxc
    assert (root / "etc/pve/nodes/pve1/lxc/200.conf").exists()


def test_read_lxc_missing_container(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    with pytest.raises(
        PveError, match=r"Configuration file 'nodes/pve1/lxc/999.conf' does not exist"
    ):
        lxc_devices.read_lxc(root, 999)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")
def test_device_rules_use_live_major_minor(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    fake_node(root, "/dev/nvidia0")
    write_conf(root, "lxc", 101, "dev0: /dev/nvidia0,gid=44,deny-write=1\n")
    (rule,) = lxc_devices.lxc_device_rules(root, lxc_devices.read_lxc(root, 101))
    assert (rule.kind, rule.major, rule.minor, rule.gid, rule.mode) == ("c", 195, 0, 44, 0o660)
    assert rule.cgroup_lines == (
        "lxc.cgroup2.devices.allow = c 195:0 r",
        "lxc.cgroup2.devices.deny = c 195:0 w",
    )
    write_conf(root, "lxc", 102, "dev0: /dev/nvidia-uvm\n")
    with pytest.raises(PveError, match="Device /dev/nvidia-uvm does not exist"):
        lxc_devices.lxc_device_rules(root, lxc_devices.read_lxc(root, 102))
    fake_node(root, "/dev/plainfile", char=False)
    write_conf(root, "lxc", 103, "dev0: /dev/plainfile\n")
    with pytest.raises(PveError, match="/dev/plainfile is not a device"):
        lxc_devices.lxc_device_rules(root, lxc_devices.read_lxc(root, 103))


def test_lxc_init_cwd_is_a_pve9_key() -> None:
    """pve-container 1c7f64d (6.0.1) allowed lxc.init.cwd; 5.3.5 (PVE 8.4) does not know it."""
    raw = "arch: amd64\nlxc.init.cwd: /srv\n"
    pve8, pve9 = cfg.parse_config("lxc", 101, raw), cfg.parse_config("lxc", 101, raw, release=9)
    assert pve8.main.lxc == [] and pve8.warnings == [
        "vm 101 - unable to parse config: lxc.init.cwd: /srv"
    ]
    assert pve9.main.lxc == [("lxc.init.cwd", "/srv")] and pve9.warnings == []
