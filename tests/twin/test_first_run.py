"""What a newcomer sees: a system sshd on port 22 named plainly, `twin list`/`stop` always saying
something, a down twin called down. No twins are started here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from twin import node, processes

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"


def _row(local: str, state: str = "0A") -> str:
    return f"   0: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000  0\n"


def test_system_sshd_on_all_ipv4_addresses_is_found() -> None:
    tcp = HEADER + _row("00000000:0016") + _row("0200007F:0016")
    assert processes.wildcard_port_22(tcp) == ["0.0.0.0:22"]


def test_system_sshd_on_all_ipv6_addresses_is_found() -> None:
    tcp6 = HEADER + _row("00000000000000000000000000000000:0016")
    assert processes.wildcard_port_22(HEADER, tcp6) == ["[::]:22"]


def test_twins_own_sshds_and_other_ports_and_connections_are_not_a_clash() -> None:
    tcp = (
        HEADER
        + _row("0200007F:0016")  # twin1's sshd on 127.0.0.2:22
        + _row("00000000:0050")  # something on 0.0.0.0:80
        + _row("00000000:0016", state="01")  # an established connection, not a listener
    )
    assert processes.wildcard_port_22(tcp, HEADER) == []


def test_the_clash_message_says_what_to_do() -> None:
    message = processes.WILDCARD_SSHD.format(where="0.0.0.0:22")
    assert "systemctl stop ssh" in message and "ListenAddress" in message


def _twin_cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPUHOST_TWIN_STATE=str(state))
    return subprocess.run(
        [sys.executable, "-m", "twin", *args], env=env, capture_output=True, text=True, check=True
    )


def test_list_says_when_no_twin_runs(tmp_path: Path) -> None:
    assert "no twins running" in _twin_cli(tmp_path / "state", "list").stdout


def test_list_calls_a_twin_without_supervisor_down(tmp_path: Path) -> None:
    tdir = tmp_path / "twin7"
    tdir.mkdir()
    (tdir / "twin.json").write_text(
        json.dumps({"name": "twin7", "index": 7, "profile": "kpro6", "base": "/nonexistent"})
    )
    out = _twin_cli(tmp_path, "list").stdout
    assert "twin7\t127.0.0.8\tkpro6\tdown (" in out and "python -m twin stop twin7" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="python -m twin stop needs root")
def test_stop_says_what_it_did(tmp_path: Path) -> None:
    assert _twin_cli(tmp_path, "stop", "--all").stdout == "no twins running\n"
    assert _twin_cli(tmp_path, "stop", "twin9").stdout == "twin9: no such twin\n"


def test_nothing_answers_ssh_on_an_unused_address() -> None:
    assert not node.answers_ssh("127.0.0.254", timeout=0.5)


ROOT = Path(__file__).parents[2]


def _with_policy(policy: Path, command: str) -> subprocess.CompletedProcess[str]:
    """gpuhost-setup's with_policy_rc_d around `command`, on a policy-rc.d path of the test's."""
    script = f'set -euo pipefail; . ./gpuhost-setup; with_policy_rc_d sh -c "{command}"'
    env = dict(os.environ, GPUHOST_POLICY_RC_D=str(policy))
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)


def test_setup_keeps_an_existing_policy_rc_d_also_when_apt_fails(tmp_path: Path) -> None:
    policy = tmp_path / "policy-rc.d"
    policy.write_text("#!/bin/sh\n# the machine's own\nexit 0\n")
    policy.chmod(0o700)
    run = _with_policy(policy, f"grep -q 'exit 101' {policy} && exit 3")
    assert run.returncode == 3  # the refusing policy was in place while the command ran
    assert policy.read_text() == "#!/bin/sh\n# the machine's own\nexit 0\n"
    assert policy.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy-rc.d"]


def test_setup_leaves_no_policy_rc_d_where_there_was_none(tmp_path: Path) -> None:
    policy = tmp_path / "policy-rc.d"
    assert _with_policy(policy, f"test -x {policy}").returncode == 0
    assert not policy.exists()
    assert _with_policy(policy, "kill -TERM \\$PPID; sleep 1").returncode != 0  # interrupted
    assert list(tmp_path.iterdir()) == []
