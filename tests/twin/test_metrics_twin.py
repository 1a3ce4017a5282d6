"""`gpuhost metrics` over real SSH on an h200x2 twin with a GPU container: valid exposition text,
and a drift planted the way it happens (the container keeps an older NVIDIA userspace after a
driver upgrade) turns exactly its check to 0, which the shipped alert rule then fires on; the
audit (`gpuhost audit`) reports every check as the metrics do."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from twin import driver, node
from twin.pytest_plugin import PVE_DIRS, TwinHandle

ROOT = Path(__file__).parents[2]
VERSION = "580.159.04"
OLD = "575.57.08"
NODES = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
CT200 = "arch: amd64\nhostname: ct200\nostype: debian\nunprivileged: 1\n" + "".join(
    f"dev{i}: {path}\n" for i, path in enumerate(NODES)
)
PROMTOOL = shutil.which("promtool")


def inventory(path: Path, twin: TwinHandle, kernel: str) -> Path:
    spec = {
        "kernel": {"version": kernel},
        "driver": {"version": VERSION},
        "boot": {"iommu": False},
        "guests": [{"kind": "lxc", "ctid": 200, "name": "ct200", "gpus": ["0000:00:06.0"]}],
    }
    path.write_text(
        "from gpuhost.spec.inventory import gpu_host\n"
        f"hosts = [gpu_host({twin.name!r}, {spec!r}, ssh_hostname={twin.address!r}, "
        f"ssh_user='root', ssh_key={str(twin.key)!r}, "
        f"ssh_known_hosts_file={str(twin.known_hosts)!r}, ssh_strict_host_key_checking='yes')]\n"
    )
    return path


def metrics(inv: Path, out: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-m", "gpuhost.cli", "metrics", str(inv), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    if PROMTOOL:
        check = subprocess.run(
            [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, check=False
        )
        assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def audit_agrees(inv: Path, found: dict[str, float], host: str, tmp_path: Path) -> None:
    """`gpuhost audit --json` (the pytest plugin, over SSH) reports each check as the metrics do."""
    report = tmp_path / "audit.json"
    done = subprocess.run(
        [sys.executable, "-m", "gpuhost.cli", "audit", str(inv), "--json", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert report.is_file(), done.stdout[-3000:] + done.stderr[-2000:]
    results = json.loads(report.read_text())["results"]
    assert len(results) == sum(k.startswith("gpuhost_check_applicable") for k in found)
    for r in results:
        guest = r["target"].partition("/")[2]
        labels = f'host="{host}",guest="{guest}",check="{r["check"]}"'
        assert found[f"gpuhost_check_applicable{{{labels}}}"] == (r["status"] != "skipped")
        if r["status"] != "skipped":
            assert found[f"gpuhost_check_ok{{{labels}}}"] == (r["status"] == "passed"), labels


def alert_fires(text: str, alert: str, tmp_path: Path) -> list[dict]:
    """The shipped rules evaluated on ``text`` held for 10 minutes: promtool's failure output
    lists the alerts that did fire when none was expected."""
    series = [
        {"series": line.rsplit(" ", 1)[0], "values": f"{line.rsplit(' ', 1)[1]}x10"}
        for line in text.splitlines()
        if line and not line.startswith("#")
    ]
    rules = ROOT / "monitoring/prometheus/gpuhost-alerts.yml"
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": "8m", "alertname": alert, "exp_alerts": []}],
            }
        ],
    }
    path = tmp_path / "real-output.test.yml"
    path.write_text(yaml.safe_dump(test))
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    return [] if done.returncode == 0 else [done.stdout + done.stderr]


def test_a_planted_userspace_drift_turns_its_check_to_0_and_fires(twin_fleet, tmp_path):
    (twin,) = twin_fleet.start(1, "h200x2")
    try:
        assert twin.twin is not None
        driver.install(twin.twin, VERSION)
        for args in ("-c=0", "-c=1", "-u -c=0"):
            assert twin.run(f"nvidia-modprobe {args}")[0] == 0
        twin.run(f"{PVE_DIRS}; cat > /etc/pve/lxc/200.conf <<'EOF'\n{CT200}EOF")
        rc, _, err = twin.request('{"op": "ct-start", "ctid": 200}')
        assert rc == 0, err
        driver.install_userspace(node.Twin.load(twin.name), 200, VERSION)
        inv = inventory(tmp_path / "h200x2.py", twin, twin.run("uname -r")[1].strip())
        out = tmp_path / "gpuhost.prom"

        before = metrics(inv, out)
        host, ct = f'host="{twin.name}"', f'host="{twin.name}",guest="ct200"'
        assert before[f'gpuhost_check_ok{{{ct},check="ct.userspace"}}'] == 1
        assert before[f'gpuhost_check_ok{{{ct},check="ct.nodes"}}'] == 1
        assert before[f"gpuhost_guest_gpu_nodes{{{ct}}}"] == 1
        assert before[f'gpuhost_guest_userspace_info{{{ct},userspace="{VERSION}"}}'] == 1
        assert (
            before[
                f'gpuhost_gpu_info{{{host},gpu="0000:00:06.0",index="0",uuid="GPU-904a02bd-6d34-0f67-bb40-f5dd3ee54cc2",name="NVIDIA H200",vbios="96.00.A5.00.1A",guest="ct200"}}'
            ]
            == 1
        )
        assert before[f'gpuhost_gpu_memory_temperature_celsius{{{host},gpu="0000:00:07.0"}}'] > 0
        if PROMTOOL:
            assert alert_fires(out.read_text(), "GpuhostDriverUserspaceMismatch", tmp_path) == []

        driver.install_userspace(node.Twin.load(twin.name), 200, OLD)  # the planted drift
        after = metrics(inv, out)
        assert after[f'gpuhost_check_ok{{{ct},check="ct.userspace"}}'] == 0
        assert after[f'gpuhost_guest_userspace_info{{{ct},userspace="{OLD}"}}'] == 1
        flipped = {
            k for k, v in after.items() if k.startswith("gpuhost_check_ok") and before.get(k) != v
        }
        assert all("ct200" in k for k in flipped), flipped  # only the guest's checks moved
        audit_agrees(inv, after, twin.name, tmp_path)
        if PROMTOOL:
            (fired,) = alert_fires(out.read_text(), "GpuhostDriverUserspaceMismatch", tmp_path)
            assert f'userspace="{OLD}"' in fired and 'guest="ct200"' in fired
        else:
            pytest.skip("promtool is missing: the Debian package prometheus (./gpuhost-setup)")
    finally:
        twin_fleet.stop(twin)
