"""The `gpuhost` command end to end on saved snapshots and on the local machine."""

import subprocess
import sys
from pathlib import Path

import pytest

from gpuhost.cli import main
from gpuhost.observe.hostfacts import FACTS, write_snapshot
from tests.unit.conftest import FIXTURES
from tests.unit.hosts import kpro6_raw

ROOT = Path(__file__).parents[2]
H200_INVENTORY = """
from gpuhost.spec.inventory import gpu_host
gpu_hosts = [gpu_host("h200", ssh_hostname="192.0.2.1", spec={
    "kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "580.159.04"},
    "guests": [{"kind": "lxc", "ctid": 200, "name": "ct200", "gpus": [0]},
               {"kind": "vm", "vmid": 129, "name": "vm129", "machine": "q35", "gpus": ["0000:00:07.0"]}]})]
"""


def test_plan_from_a_real_snapshot(tmp_path: Path, capsys) -> None:
    inventory = tmp_path / "h200.py"
    inventory.write_text(H200_INVENTORY)
    assert main(["plan", str(inventory), "--facts", str(FIXTURES / "captures/h200x2/facts")]) == 0
    out = capsys.readouterr().out
    assert (
        "0    0000:00:06.0  NVIDIA H200  -     -      nvidia -> nvidia       lxc 200 (ct200)" in out
    )
    assert (
        "1    0000:00:07.0  NVIDIA H200  -     -      nvidia -> vfio-pci     vm 129 (vm129)" in out
    )
    assert "  - GPU 0000:00:07.0 binds vfio-pci (now nvidia)" in out


def test_plan_kpro6_inventory_from_snapshot(tmp_path: Path, capsys) -> None:
    write_snapshot(tmp_path / "kpro6", kpro6_raw())
    assert main(["plan", str(ROOT / "inventory/kpro6.py"), "--facts", str(tmp_path / "kpro6")]) == 0
    out = capsys.readouterr().out
    assert "GPU plan for kpro6" in out and out.count("-> vfio-pci     vm 129 (vm129)") == 2


def test_refused_plan_exits_2_and_names_the_problem(tmp_path: Path, capsys) -> None:
    inventory = tmp_path / "h200.py"
    inventory.write_text(H200_INVENTORY.replace('"gpus": [0]', '"gpus": [5]'))
    assert main(["plan", str(inventory), "--facts", str(FIXTURES / "captures/h200x2/facts")]) == 2
    err = capsys.readouterr().err
    # the refusal names the inventory file, as spec refusals do
    assert f"gpuhost: {inventory}: host 'h200': the plan is refused" in err
    assert "GPU index 5 does not exist" in err


def test_bad_spec_is_reported_before_any_connection(tmp_path: Path) -> None:
    inventory = tmp_path / "bad.py"
    # 192.0.2.1 is TEST-NET: a connection attempt would hang or fail, not print a spec error
    inventory.write_text(H200_INVENTORY.replace('"vmid": 129', '"vmid": 12'))
    run = subprocess.run(
        [sys.executable, "-m", "gpuhost.cli", "plan", str(inventory)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert run.returncode == 2
    assert "invalid gpuhost spec" in run.stderr and "guests[1].vmid = 12" in run.stderr
    assert "greater than or equal to 100" in run.stderr


def test_capture_local_machine_over_pyinfra(tmp_path: Path) -> None:
    assert main(["capture", "@local", "--out", str(tmp_path / "snap")]) == 0
    for key in FACTS:
        assert (tmp_path / "snap" / f"{key}.rc").exists()
    assert (tmp_path / "snap" / "KernelBuildInfo.out").read_text().startswith("Linux version ")


def test_capture_script_matches_live_capture(tmp_path: Path) -> None:
    script = tmp_path / "capture.sh"
    assert main(["capture", "@local", "--out", str(tmp_path / "live")]) == 0
    script.write_text(
        subprocess.run(
            [sys.executable, "-m", "gpuhost.cli", "capture-script"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout
    )
    subprocess.run(["sh", str(script), str(tmp_path / "scripted")], check=True)
    for key in FACTS:
        for ext in ("cmd", "rc"):
            assert (tmp_path / "live" / f"{key}.{ext}").read_text() == (
                tmp_path / "scripted" / f"{key}.{ext}"
            ).read_text(), key


MAIN = "import sys; from gpuhost.cli import main; sys.exit(main())"  # the console script's call


@pytest.mark.parametrize("autoload", ["installed plugins", "no plugin autoload"])
def test_audit_loads_its_own_plugin_and_warns_of_nothing(tmp_path: Path, autoload: str) -> None:
    # With autoload off no pytest11 entry point is loaded, as from a source tree on PYTHONPATH;
    # with it on, the installed ones (typeguard's among them) are there. Either way the audit takes
    # --inventory and stops at the unknown host key, before any connection, without a warning.
    (tmp_path / "known_hosts").write_text("")
    inventory = tmp_path / "h200.py"
    inventory.write_text(
        H200_INVENTORY.replace(
            'ssh_hostname="192.0.2.1"',
            f'ssh_hostname="192.0.2.1", ssh_known_hosts_file="{tmp_path / "known_hosts"}"',
        )
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    if autoload == "no plugin autoload":
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    run = subprocess.run(
        [sys.executable, "-c", MAIN, "audit", str(inventory)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 3, output
    assert "h200: no host key for 192.0.2.1" in output, output
    assert "warning" not in output.lower(), output
