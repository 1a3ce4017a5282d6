"""Host keys are verified: an unknown key stops gpuhost before it connects, saying how to add it."""

import subprocess
import sys
from pathlib import Path

import paramiko
import pytest

from gpuhost.audit.connect import UnknownHostKey, guest_runners, host_runner
from gpuhost.hostkeys import unknown_host_key
from gpuhost.spec.guests import LxcGuest
from tests.unit.test_cli import H200_INVENTORY, ROOT

KEY = paramiko.RSAKey.generate(1024)


def known_hosts(path: Path, *entries: str) -> Path:
    keys = paramiko.HostKeys()
    for entry in entries:
        keys.add(paramiko.HostKeys.hash_host(entry), KEY.get_name(), KEY)  # hashed, as ssh writes
    keys.save(str(path))
    return path


def test_unknown_key_names_the_host_the_file_and_the_fix(tmp_path: Path) -> None:
    path = known_hosts(tmp_path / "known_hosts", "other.lan")
    data = {"ssh_hostname": "kpro6.lan", "ssh_known_hosts_file": str(path)}
    problem = unknown_host_key("kpro6", data)
    assert problem is not None
    assert problem.startswith(f"kpro6: no host key for kpro6.lan in {path}")
    assert f"ssh-keyscan -H kpro6.lan >> {path}" in problem
    problem = unknown_host_key("kpro6", {**data, "ssh_port": 2222})
    assert "no host key for [kpro6.lan]:2222" in problem and "ssh-keyscan -H -p 2222" in problem


def test_known_key_hashed_or_not_passes(tmp_path: Path) -> None:
    path = known_hosts(tmp_path / "known_hosts", "kpro6.lan", "[kpro7.lan]:2222")
    data = {"ssh_known_hosts_file": str(path)}
    assert unknown_host_key("kpro6", {**data, "ssh_hostname": "kpro6.lan"}) is None
    assert (
        unknown_host_key("kpro7", {**data, "ssh_hostname": "kpro7.lan", "ssh_port": 2222}) is None
    )


def test_a_guest_with_its_own_ssh_is_judged_by_its_own_key(tmp_path: Path) -> None:
    """The runner the audit and `gpuhost metrics` share: the host's key is known, the guest's
    (its own address and port) is not; the guest stops before it connects, saying so, and the
    inventory's secrets are not in the message."""
    path = known_hosts(tmp_path / "known_hosts", "kpro6.lan")
    data = {
        "ssh_hostname": "kpro6.lan",
        "ssh_known_hosts_file": str(path),
        "ssh_password": "hunter2-x",
    }
    assert callable(host_runner("kpro6", data))  # testinfra connects on its first command only
    guest = LxcGuest(name="ct200", ctid=200, access={"ssh_hostname": "ct200.lan", "ssh_port": 2222})
    with pytest.raises(UnknownHostKey) as raised:
        guest_runners("kpro6", data)(guest)
    message = str(raised.value)
    assert message.startswith(f"kpro6: no host key for [ct200.lan]:2222 in {path}"), message
    assert "ssh-keyscan -H -p 2222 ct200.lan" in message and "hunter2" not in message


def test_only_strict_checking_is_judged(tmp_path: Path) -> None:
    data = {"ssh_known_hosts_file": str(tmp_path / "absent"), "ssh_hostname": "kpro6.lan"}
    assert unknown_host_key("kpro6", {**data, "ssh_strict_host_key_checking": "no"}) is None
    assert unknown_host_key("@local", {}) is None
    assert unknown_host_key("kpro6", data) is not None  # strict is gpu_host()'s default


def test_gpuhost_plan_stops_before_connecting(tmp_path: Path) -> None:
    inventory = tmp_path / "h200.py"
    absent = tmp_path / "known_hosts"
    inventory.write_text(
        H200_INVENTORY.replace(
            'ssh_hostname="192.0.2.1",',
            f'ssh_hostname="192.0.2.1", ssh_known_hosts_file="{absent}",',
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "gpuhost.cli", "plan", str(inventory)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,  # 192.0.2.1 (TEST-NET) would hang a connection attempt
    )
    assert run.returncode == 2, run.stderr
    assert f"h200: no host key for 192.0.2.1 in {absent}" in run.stderr
    assert "ssh-keyscan -H 192.0.2.1" in run.stderr


def test_pyinfra_run_says_how_to_add_the_key_before_it_connects(tmp_path: Path) -> None:
    """Under the pyinfra CLI the hint comes while the inventory loads, before pyinfra's own
    refusal (which names no fix); nothing listens on port 1, so nothing is reached."""
    inventory = tmp_path / "h200.py"
    absent = tmp_path / "known_hosts"
    inventory.write_text(
        H200_INVENTORY.replace(
            'ssh_hostname="192.0.2.1",',
            f'ssh_hostname="127.0.0.1", ssh_port=1, ssh_known_hosts_file="{absent}",',
        )
    )
    pyinfra = Path(sys.executable).parent / "pyinfra"
    run = subprocess.run(
        [str(pyinfra), "--dry", str(inventory), "deploys/gpu_host.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    output = run.stdout + run.stderr
    assert run.returncode != 0
    hint = f"gpuhost: h200: no host key for [127.0.0.1]:1 in {absent}"
    assert hint in output and "ssh-keyscan -H -p 1 127.0.0.1" in output
    assert output.index(hint) < output.index("--> Connecting to hosts")
