"""Twins over real SSH: host keys, isolation, reboot, systemctl, teardown."""

import subprocess
import time
from pathlib import Path

import paramiko
import pytest

from twin import mounts, node, processes
from twin.pytest_plugin import PVE_DIRS

twin_count = 2


def test_login_verifies_host_key(twins):
    for t in twins:
        rc, out, _ = t.run("uname -n; id -u; cat /etc/debian_version")
        assert rc == 0
        name, uid, version = out.split()
        assert (name, uid) == (t.name, "0")
        assert version.startswith("12.")


def test_unknown_host_key_is_refused(twin, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    client = paramiko.SSHClient()
    client.load_host_keys(str(empty))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        client.connect(twin.address, username="root", key_filename=str(twin.key), timeout=5)
    client.close()


def test_openssh_uses_known_hosts(twin, tmp_path):
    ok = subprocess.run(
        ["ssh", "-F", str(twin.ssh_config), f"root@{twin.address}", "echo", "hello"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (ok.returncode, ok.stdout) == (0, "hello\n"), ok.stderr
    (tmp_path / "kh").write_text("")
    bad = subprocess.run(
        [
            "ssh",
            "-F",
            str(twin.ssh_config),
            "-o",
            f"UserKnownHostsFile={tmp_path / 'kh'}",
            f"root@{twin.address}",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 255
    assert "Host key verification failed" in bad.stderr


def test_password_login_is_off(twin):
    transport = paramiko.Transport((twin.address, 22))
    transport.connect()
    try:
        with pytest.raises(paramiko.BadAuthenticationType) as err:
            transport.auth_password("root", "root")
        assert err.value.allowed_types == ["publickey"]
    finally:
        transport.close()


def test_testinfra_host_and_sftp(twin):
    host = twin.host
    assert host.file("/etc/os-release").contains("bookworm")
    assert host.file("/root").is_directory
    client = twin.connect()
    try:
        sftp = client.open_sftp()  # pyinfra uploads files over SFTP (internal-sftp, chrooted)
        with sftp.open("/root/uploaded", "w") as f:
            f.write("via sftp\n")
        sftp.close()
    finally:
        client.close()
    assert (twin.root / "root/uploaded").read_text() == "via sftp\n"


def test_overlays_are_isolated(twins):
    a, b = twins
    assert a.run("echo only-a > /etc/only-a")[0] == 0
    assert a.run("test -f /etc/only-a")[0] == 0
    assert b.run("test -f /etc/only-a")[0] == 1
    assert not (Path(a.twin.base) / "etc/only-a").exists()
    assert a.run("rm /usr/bin/make")[0] == 0  # a whiteout in A's upper layer only
    assert b.run("test -x /usr/bin/make")[0] == 0


def test_uptime_is_kept_true(twin):
    first = float(twin.run("cat /proc/uptime")[1].split()[0])
    time.sleep(2.2)
    second = float(twin.run("cat /proc/uptime")[1].split()[0])
    assert 1.0 < second - first < 4.0


@pytest.mark.parametrize("command", ["reboot", "systemctl reboot", "shutdown -r now"])
def test_reboot_drops_sessions_and_comes_back(twins, command):
    t = twins[1]
    assert t.run("mknod /dev/stale c 195 0")[0] == 0
    uptime_before = float(t.run("cat /proc/uptime")[1].split()[0])
    boot_before = t.boot_id()
    live = t.connect()
    _, out, _ = live.exec_command("echo started; sleep 600")
    assert out.readline() == "started\n"
    t.reboot(command)
    # The live session really died with the reboot: its channel is closed without exit status 0.
    assert out.channel.recv_exit_status() == -1
    live.close()
    assert t.boot_id() != boot_before
    rc, text, _ = t.run("cat /proc/uptime /proc/sys/kernel/random/boot_id; ls /dev/stale")
    assert float(text.split()[0]) < max(uptime_before, 1.0) + 1
    assert text.split()[2] == t.boot_id()
    assert rc != 0, "/dev is volatile: a node made before the reboot is gone"
    assert "sleep" not in [_comm(p) for p in processes.twin_processes(t.twin.dir)]


def test_reboot_drops_idle_sessions_too(twins):
    """An open SSH connection with no command running must not outlive the reboot either
    (sshd's per-connection monitor runs outside the chroot, in a session of its own)."""
    t = twins[1]
    idle = t.connect()
    assert idle.exec_command("true")[1].channel.recv_exit_status() == 0
    t.reboot()
    with pytest.raises(Exception):  # noqa: B017  (paramiko raises SSHException or EOFError)
        idle.exec_command("cat /proc/sys/kernel/random/boot_id")[1].read()
    idle.close()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_systemctl_shim_records_units(twin):
    unit = "[Unit]\nDescription=demo\n[Service]\nExecStart=/bin/sleep 600\n[Install]\nWantedBy=multi-user.target\n"
    twin.run(f"mkdir -p /etc/systemd/system && printf '{unit}' > /etc/systemd/system/demo.service")
    assert twin.run("systemctl is-active demo")[:2] == (3, "inactive\n")
    assert twin.run("systemctl start demo && systemctl is-active demo")[:2] == (0, "active\n")
    # a simple unit's process runs for real, and stop ends it
    pid = twin.run("cat /run/gpuhost-twin/systemd/demo.service.pid")[1].strip()
    assert twin.run(f"kill -0 {pid}")[0] == 0
    assert twin.run(f"systemctl stop demo; kill -0 {pid}")[0] != 0
    assert twin.run("systemctl is-active demo")[:2] == (3, "inactive\n")
    assert twin.run("systemctl start demo && systemctl is-active demo")[:2] == (0, "active\n")
    out = twin.run("systemctl show --all --property Id --property SubState demo.service")[1]
    assert out.split() == ["Id=demo.service", "SubState=running"]
    assert twin.run("systemctl is-enabled demo")[:2] == (1, "disabled\n")
    assert twin.run("systemctl enable demo")[0] == 0
    assert twin.run("systemctl is-enabled demo")[:2] == (0, "enabled\n")
    assert twin.run("systemctl start nosuch")[0] == 5
    twin.reboot()
    # After a boot, enabled units are active again and /run state from before is gone.
    assert twin.run("systemctl is-active demo")[:2] == (0, "active\n")
    twin.run("systemctl disable demo && systemctl stop demo")
    twin.reboot()
    assert twin.run("systemctl is-active demo")[:2] == (3, "inactive\n")


def test_unknown_request_is_answered(twin):
    rc, _, err = twin.request('{"op": "frobnicate"}')
    assert rc == 2 and "unknown twin request op" in err


def test_stop_leaves_nothing_behind(twin_fleet):
    (t,) = twin_fleet.start(1)
    t.run(f"{PVE_DIRS}; echo 'hostname: ct' > /etc/pve/lxc/150.conf")
    assert t.request('{"op": "ct-start", "ctid": 150}')[0] == 0
    live = t.connect()
    live.exec_command("sleep 600")
    tdir = t.twin.dir
    assert mounts.mounts_below(tdir) and processes.twin_processes(tdir)
    twin_fleet.stop(t)
    assert mounts.mounts_below(tdir) == []
    assert processes.twin_processes(tdir) == []
    assert not tdir.exists()
    assert t.address not in node.known_hosts().read_text()
    assert t.guest(150).address not in node.known_hosts().read_text()
    live.close()


def test_boot_runs_enabled_oneshot_units(twin):
    units = twin.root / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    for name, cmd in (
        ("good", "/bin/sh -c 'id -u > /root/ran'"),
        ("bad", "/bin/sh -c 'echo broken >&2; exit 3'"),
    ):
        (units / f"{name}.service").write_text(
            f"[Unit]\nConditionPathExists=/etc\n[Service]\nType=oneshot\nExecStart={cmd}\n"
            "[Install]\nWantedBy=multi-user.target\n"
        )
    assert twin.run("systemctl enable good bad")[0] == 0
    assert twin.run("test -e /root/ran")[0] == 1  # enabling runs nothing
    twin.reboot()
    assert twin.run("cat /root/ran")[1] == "0\n"  # ran at boot, chrooted, as root
    assert twin.run("systemctl is-active good bad")[:2] == (3, "active\nfailed\n")
    rc, out, _ = twin.run("systemctl status bad")
    assert rc == 3 and "Active: failed (Result: exit-code)" in out and "broken" in out
    assert twin.run("systemctl show -p ActiveState bad")[1] == "ActiveState=failed\n"
    twin.run("systemctl disable bad good")
    twin.reboot()
    assert twin.run("systemctl is-active bad")[:2] == (3, "inactive\n")
