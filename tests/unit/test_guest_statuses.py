"""Which guests run, read as Proxmox's own tests read it, on a real kernel's output
(tests/fixtures/captures/guest-statuses: a real LXC container and a process with QEMU's argv)."""

from __future__ import annotations

import pytest

from gpuhost.observe.guest_status import GuestStatuses, parse_guest_statuses
from gpuhost.observe.parse import UnparsedOutput
from tests.unit.conftest import FIXTURES

CAPTURE = FIXTURES / "captures" / "guest-statuses"


def captured() -> list[str]:
    return (CAPTURE / "GuestStatuses.out").read_text().splitlines()


def test_the_capture_was_made_with_the_probes_command() -> None:
    assert (CAPTURE / "GuestStatuses.cmd").read_text().rstrip("\n") == GuestStatuses().command()
    assert (CAPTURE / "GuestStatuses.rc").read_text().strip() == "0"


def test_real_container_socket_and_qemu_process_read_as_running() -> None:
    assert GuestStatuses().process(captured()) == {
        ("lxc", 200): "running",  # its LXC monitor listens on @/var/lib/lxc/200/command
        ("lxc", 201): "stopped",  # configured, no socket
        ("qemu", 129): "running",  # pid file -> live process with -pidfile that file
        ("qemu", 130): "stopped",  # pid file naming no process
    }


def with_129(edit) -> dict[tuple[str, int], str]:
    return parse_guest_statuses([edit(line) for line in captured()])


def test_a_zombie_or_another_program_behind_the_pid_file_is_not_a_running_vm() -> None:
    zombie = with_129(lambda s: s.replace("state 129 S", "state 129 Z"))
    assert zombie[("qemu", 129)] == "stopped"  # PVE::ProcFSTools::check_process_running
    not_qemu = with_129(lambda s: s.replace("arg 129 /usr/bin/kvm", "arg 129 /usr/bin/sleep"))
    assert not_qemu[("qemu", 129)] == "stopped"  # parse_cmdline: argv0 kvm or qemu-system-*
    other = with_129(lambda s: s.replace("/129.pid", "/131.pid") if s.startswith("arg") else s)
    assert other[("qemu", 129)] == "stopped"  # its -pidfile is another VM's
    assert (
        with_129(lambda s: s.replace("/usr/bin/kvm", "/usr/bin/qemu-system-x86_64"))[("qemu", 129)]
        == "running"
    )


def test_a_socket_of_another_lxcpath_does_not_count() -> None:
    lines = ["config lxc 300", "socket @/var/lib/lxc/300/command"]
    assert parse_guest_statuses(lines) == {("lxc", 300): "running"}
    with pytest.raises(UnparsedOutput):
        parse_guest_statuses(["config lxc 300", "socket @/srv/lxc/300/command"])


def test_no_guests_and_unknown_lines() -> None:
    assert parse_guest_statuses([]) == {}
    with pytest.raises(UnparsedOutput):
        parse_guest_statuses(["config openvz 100"])


def test_the_earlier_pct_qm_list_capture_still_parses() -> None:
    lines = [
        "==> lxc <==",
        "VMID       Status     Lock         Name                ",
        "200        running                 ct200               ",
        "==> qemu <==",
        "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID       ",
        "       129 vm129                stopped    2048               0.00 0         ",
    ]
    assert parse_guest_statuses(lines) == {("lxc", 200): "running", ("qemu", 129): "stopped"}
