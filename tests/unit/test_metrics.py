"""`gpuhost metrics` on the real 1x H200 machine's recorded output (tests/unit/metrics_replay.py):
the audit's checks, versions and GPU telemetry as Prometheus text, checked by promtool."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhost.cli import main
from gpuhost.metrics import command
from gpuhost.metrics.collect import measure, samples
from gpuhost.metrics.families import FAMILIES
from gpuhost.metrics.render import render, sample
from gpuhost.spec.inventory import load_inventory
from gpuhost.spec.specfile import dump_spec
from tests.unit.metrics_replay import replay

WRONG = "tests/fixtures/inventories/audit/h200_wrong.py"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is missing: the Debian package prometheus (./gpuhost-setup)"
)


def metrics(inventory: str, name: str) -> str:
    spec = load_inventory(inventory)[name][0]
    return render(samples(name, measure(name, spec, replay)))


def series(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def promtool_check(text: str) -> subprocess.CompletedProcess:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )


@needs_promtool
def test_real_h200_audit_renders_valid_exposition_text():
    text = metrics("inventory/h200.py", "h200")
    done = promtool_check(text)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    found = series(text)
    assert found['gpuhost_check_ok{host="h200",guest="",check="driver.version"}'] == 1
    assert found['gpuhost_checks{host="h200",status="passed"}'] == 13
    assert found['gpuhost_checks{host="h200",status="failed"}'] == 0
    # not applicable: applicable 0 and no ok series (neither pass nor fail)
    assert found['gpuhost_check_applicable{host="h200",guest="",check="boot.iommu_groups"}'] == 0
    assert not [k for k in found if "boot.iommu_groups" in k and k.startswith("gpuhost_check_ok")]
    info = (
        'gpuhost_driver_info{host="h200",driver="580.159.04",module="580.159.04",'
        'userspace="580.159.04",gsp_firmware="580.159.04"}'
    )
    assert found[info] == 1
    assert found['gpuhost_nvidia_uvm_major{host="h200"}'] == 238
    gpu = 'host="h200",gpu="0000:00:06.0"'
    assert found[f"gpuhost_gpu_temperature_celsius{{{gpu}}}"] == 35
    assert found[f"gpuhost_gpu_power_draw_watts{{{gpu}}}"] == 78.44
    assert found[f"gpuhost_gpu_memory_total_bytes{{{gpu}}}"] == 143771 * 1024 * 1024
    assert found[f'gpuhost_gpu_remapped_rows{{{gpu},kind="uncorrectable"}}'] == 0
    # [N/A] on the H200 (Hopper remaps rows, retires no pages): absent, not 0
    assert not [k for k in found if k.startswith("gpuhost_gpu_retired_pages")]


@pytest.mark.parametrize(
    ("host", "failed"),
    [
        ("h200-driver", {"driver.version"}),
        ("h200-hmm", {"modules.parameters", "modules.files"}),
        ("h200-count", {"gpus.inventory"}),
    ],
)
def test_a_drift_turns_its_check_to_0(host, failed):
    found = series(metrics(WRONG, host))
    zero = {
        k.split('check="')[1].rstrip('"}')
        for k, v in found.items()
        if k.startswith("gpuhost_check_ok{") and v == 0
    }
    assert zero == failed
    assert found[f'gpuhost_checks{{host="{host}",status="failed"}}'] == len(failed)


def test_families_render_once_with_help_and_type_in_a_stable_order():
    text = metrics("inventory/h200.py", "h200")
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert names == sorted(set(names)) and set(names) <= set(FAMILIES)
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert helps == names
    again = metrics("inventory/h200.py", "h200")
    strip = lambda t: [ln for ln in t.splitlines() if "duration" not in ln and "last_run" not in ln]  # noqa: E731
    assert strip(again) == strip(text)


@needs_promtool
def test_label_values_are_escaped():
    odd = 'a "quoted" back\\slash\nnew line'
    text = render([sample("gpuhost_guest_userspace_info", 1, host="h", guest="g", userspace=odd)])
    assert 'userspace="a \\"quoted\\" back\\\\slash\\nnew line"' in text
    assert promtool_check(text).returncode == 0


def test_unregistered_family_or_labels_are_refused():
    with pytest.raises(ValueError, match="not a registered metric family"):
        sample("gpuhost_nope", 1, host="h")
    with pytest.raises(ValueError, match="takes labels"):
        sample("gpuhost_check_ok", 1, host="h")
    with pytest.raises(ValueError, match="written twice"):
        render([sample("gpuhost_audit_plan_ok", 1, host="h")] * 2)


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(dump_spec(load_inventory("inventory/h200.py")["h200"][0]))
    return path


def test_local_command_writes_the_file_atomically_0644(spec_file, tmp_path, monkeypatch):
    monkeypatch.setattr(command, "local_runner", replay)  # the machine: its recorded output
    out = tmp_path / "textfile" / "gpuhost.prom"
    out.parent.mkdir()
    out.write_text("old\n")
    os.chmod(out, 0o600)
    argv = [
        "metrics",
        "--local",
        "--spec",
        str(spec_file),
        "--host-name",
        "h200",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert 'gpuhost_check_ok{host="h200",guest="",check="driver.version"} 1' in out.read_text()
    assert os.listdir(out.parent) == ["gpuhost.prom"]  # no temporary file left


def test_nothing_measured_exits_1_and_writes_nothing(spec_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "local_runner", lambda cmd: (255, "", "pct: not found"))
    out = tmp_path / "gpuhost.prom"
    argv = [
        "metrics",
        "--local",
        "--spec",
        str(spec_file),
        "--host-name",
        "h200",
        "--out",
        str(out),
    ]
    assert main(argv) == 1
    assert not out.exists()
    assert "h200 could not be measured" in capsys.readouterr().err


def test_local_needs_spec_and_name(capsys):
    assert main(["metrics", "--local"]) == 2
    assert "--local needs --spec FILE" in capsys.readouterr().err
    assert main(["metrics", "--local", "--spec", "/nonexistent.json", "--host-name", "x"]) == 2
    assert "/nonexistent.json: cannot read the host spec" in capsys.readouterr().err


def test_telemetry_parser_on_the_real_h200_query():
    from gpuhost.observe.telemetry import TELEMETRY_FIELDS, parse_telemetry
    from tests.unit.metrics_replay import TELEMETRY, captured_fields

    names = captured_fields()
    assert set(TELEMETRY_FIELDS) <= set(names)  # only fields proven on the real machine
    # the header of the same query with units names the same fields, in the same order
    header = (TELEMETRY / "query-gpu-units.csv").read_text().splitlines()[0].split(", ")
    shown = [h.split(" [")[0] for h in header]
    assert shown == [n.replace("throttle", "event") for n in names]
    lines = [*(TELEMETRY / "query-gpu.csv").read_text().splitlines(), "#gpuhost-exit=0"]
    (gpu,) = parse_telemetry(lines, names).gpus
    assert gpu.bdf == "0000:00:06.0" and gpu.text["name"] == "NVIDIA H200"
    assert gpu.values["power.draw"] == 78.44 and gpu.values["memory.total"] == 143771
    assert gpu.values["persistence_mode"] == 1 and gpu.values["remapped_rows.pending"] == 0
    assert "retired_pages.pending" not in gpu.values  # [N/A]: left out, not 0
    failed = parse_telemetry(["NVIDIA-SMI has failed because...", "#gpuhost-exit=9"])
    assert failed.error == "NVIDIA-SMI has failed because..." and not failed.gpus


# What the host's metrics runtime carries (gpuhost/build/runtime.py): gpuhost, pydantic, jinja2,
# packaging and their dependencies; no pyinfra, testinfra, paramiko or pytest.
RUNTIME_MODULES = (
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_extensions",
    "typing_inspection",
    "jinja2",
    "markupsafe",
    "packaging",
)


def test_the_local_command_runs_without_the_control_side_packages(tmp_path: Path):
    import importlib.util

    site = tmp_path / "site"
    site.mkdir()
    for name in RUNTIME_MODULES:
        found = importlib.util.find_spec(name)
        assert found is not None and found.origin is not None
        origin = Path(found.origin)
        source = origin.parent if origin.name == "__init__.py" else origin
        (site / source.name).symlink_to(source)
    root = Path(__file__).parents[2]
    code = (
        "import sys, gpuhost.cli\n"
        "assert not {'pyinfra', 'testinfra', 'paramiko', 'pytest'} & set(sys.modules)\n"
        "sys.exit(gpuhost.cli.main(['metrics', '--local', '--spec', '/nonexistent.json',"
        " '--host-name', 'h']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-s", "-S", "-c", code],
        env={"PYTHONPATH": f"{root}:{site}", "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert "/nonexistent.json: cannot read the host spec" in done.stderr


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"
            "#gpuhost-exit=9\n",
            "NVIDIA-SMI has failed",
        ),
        ("0, 00000000:00:06.0, only three cells\n#gpuhost-exit=0\n", "cells for"),
    ],
)
def test_telemetry_that_cannot_be_read_leaves_the_audit_metrics(answer, why):
    from gpuhost.observe.telemetry import NvidiaTelemetry

    def run(command: str) -> tuple[int, str, str]:
        return (0, answer, "") if command == NvidiaTelemetry().command() else replay(command)

    spec = load_inventory("inventory/h200.py")["h200"][0]
    measured = measure("h200", spec, run)
    assert why in (measured.telemetry.error or "")
    found = series(render(samples("h200", measured)))
    assert found['gpuhost_gpu_telemetry_up{host="h200"}'] == 0
    assert found['gpuhost_check_ok{host="h200",guest="",check="driver.version"}'] == 1
    assert not [k for k in found if k.startswith("gpuhost_gpu_") and "telemetry_up" not in k]


def test_inventory_mode_refuses_an_unknown_host_and_host_key_before_connecting(tmp_path, capsys):
    inventory = tmp_path / "h200.py"
    known = tmp_path / "known_hosts"
    known.write_text("")
    inventory.write_text(
        "from gpuhost.spec.inventory import gpu_host\n"
        "hosts = [gpu_host('h200', {'kernel': {'version': '6.8.12-9-pve'}, "
        "'driver': {'version': '580.159.04'}}, ssh_hostname='192.0.2.1', "
        f"ssh_known_hosts_file={str(known)!r})]\n"
    )
    assert main(["metrics", str(inventory), "--host", "nope"]) == 2
    assert "no host 'nope'" in capsys.readouterr().err
    assert main(["metrics", str(inventory), "--p2p-sizes", "4k"]) == 2
    assert "--p2p-sizes '4k': give byte counts" in capsys.readouterr().err
    assert main(["metrics", str(inventory), "--spec", "x.json"]) == 2
    assert "--spec and --host-name go with --local" in capsys.readouterr().err
    assert main(["metrics", str(inventory)]) == 2  # 192.0.2.1 is TEST-NET: never reached
    assert "192.0.2.1" in capsys.readouterr().err
