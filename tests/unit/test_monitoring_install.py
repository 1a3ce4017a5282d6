"""The metrics timer's install side: the spec's monitoring section, its files in the Plan, the
MonitoringState probe on real output, the runtime's contents, and the deploy's operations."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpuhost.build import runtime
from gpuhost.observe.monitoring import MonitoringState, MonitoringStateFact, parse_monitoring
from gpuhost.plan import monitoring as planmon
from gpuhost.plan.make import make_plan
from gpuhost.spec.host import HostSpec
from tests.unit.hosts import kpro6
from tests.unit.test_plan import KPRO6

CAPTURES = Path(__file__).parents[1] / "fixtures/captures/monitoring"
ON = {"enabled": True, "interval_seconds": 120}


def spec(**monitoring: object) -> HostSpec:
    return HostSpec.model_validate({**KPRO6, "monitoring": monitoring})


# --- spec ---------------------------------------------------------------------------------------


def test_monitoring_is_off_by_default_and_keeps_debians_directory() -> None:
    mon = HostSpec.model_validate(KPRO6).monitoring
    assert not mon.enabled and mon.textfile_dir == "/var/lib/prometheus/node-exporter"
    assert mon.node_exporter and mon.listen_address is None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("127.0.0.1", "is not a listen address"),
        ("127.0.0.1:0", "port 0 is out of range"),
        ("[fe80::zz]:9100", "is not a listen address"),
        ("Exporter.lan:9100", "is not a host name or address"),
        ("127.0.0.1:9100;rm", "is not a listen address"),
    ],
)
def test_a_bad_listen_address_names_the_field_and_the_fix(value: str, why: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec(enabled=True, listen_address=value)
    text = str(info.value)
    assert "monitoring.listen_address" in text and why in text and "127.0.0.1:9100" in text


@pytest.mark.parametrize("value", ["127.0.0.1:9100", "[::1]:9100", ":9100", "mon.lan:19100"])
def test_listen_addresses_node_exporter_takes(value: str) -> None:
    assert spec(enabled=True, listen_address=value).monitoring.listen_address == value


def test_interval_and_directory_are_checked() -> None:
    with pytest.raises(ValidationError, match="interval_seconds"):
        spec(enabled=True, interval_seconds=5)
    with pytest.raises(ValidationError, match="textfile_dir"):
        spec(enabled=True, textfile_dir="var/lib/x")
    with pytest.raises(ValidationError, match="enabled"):
        spec(enabled="yes")  # strict: a bool is a bool


# --- the Plan -----------------------------------------------------------------------------------


def facts_with(python: str = "Python 3.11.2") -> Any:
    return kpro6(MonitoringState=(0, [f"python={python}"]))


def test_monitoring_off_plans_every_file_absent() -> None:
    plan = make_plan("kpro6", spec(), facts_with())
    assert plan.monitoring is None
    for path in planmon.FILES:
        assert not plan.files[path].present, path


def test_monitoring_on_plans_the_units_the_script_and_the_spec() -> None:
    plan = make_plan("kpro6", spec(**ON), facts_with())
    assert plan.monitoring is not None
    assert plan.monitoring.python == "3.11"
    assert plan.monitoring.out == "/var/lib/prometheus/node-exporter/gpuhost.prom"
    files = plan.files
    timer = files[planmon.TIMER_FILE].content or ""
    assert "OnUnitActiveSec=120s" in timer and "Persistent=true" in timer
    assert "WantedBy=timers.target" in timer
    assert files[planmon.TIMER_WANTS].link == planmon.TIMER_FILE
    service = files[planmon.SERVICE_FILE].content or ""
    assert "Type=oneshot" in service and "IOSchedulingClass=idle" in service
    assert (
        "TimeoutStartSec=120" in service and "ExecStart=/usr/local/lib/gpuhost/metrics" in service
    )
    script = files["/usr/local/lib/gpuhost/metrics"]
    assert script.mode == "755"
    assert "OUT=/var/lib/prometheus/node-exporter/gpuhost.prom\n" in (script.content or "")
    assert '--host-name "$HOST"' in (script.content or "")
    assert HostSpec.model_validate_json(files[planmon.SPEC_FILE].content or "") == spec(**ON)
    assert files[planmon.SPEC_FILE].mode == "600"
    # Debian's defaults need no drop-in
    assert not files[planmon.EXPORTER_DROPIN].present


def test_the_drop_in_keeps_args_and_adds_only_what_the_spec_asks() -> None:
    plan = make_plan(
        "kpro6",
        spec(**ON, listen_address="127.0.0.1:9100", textfile_dir="/srv/prom"),
        facts_with(),
    )
    assert plan.monitoring is not None and plan.monitoring.out == "/srv/prom/gpuhost.prom"
    dropin = plan.files[planmon.EXPORTER_DROPIN].content or ""
    assert dropin.splitlines()[-2:] == [
        "ExecStart=",
        "ExecStart=/usr/bin/prometheus-node-exporter $ARGS --web.listen-address=127.0.0.1:9100 "
        "--collector.textfile.directory=/srv/prom",
    ]
    off = make_plan("kpro6", spec(**ON, listen_address=":9100", node_exporter=False), facts_with())
    assert not off.files[planmon.EXPORTER_DROPIN].present  # no node_exporter: not its drop-in


def test_a_host_name_is_quoted_in_the_script() -> None:
    text = planmon.metrics_script("kpro6 $(reboot)", "/var/lib/x/gpuhost.prom")
    assert "HOST='kpro6 $(reboot)'\n" in text


# --- the probe, on real output ------------------------------------------------------------------


def test_the_probe_command_is_the_captured_one() -> None:
    assert (CAPTURES / "MonitoringState.cmd").read_text().rstrip("\n") == (
        MonitoringStateFact().command()
    )


def test_a_host_without_anything_of_it() -> None:
    # Debian 12 (this development machine kind), no node_exporter (dpkg knows it: "un")
    state = parse_monitoring((CAPTURES / "dev-bookworm.out").read_text().splitlines())
    assert state == MonitoringState(python="3.11")


def test_a_deployed_twin() -> None:
    # a kpro6 twin after the deploy (tests/e2e/test_monitoring.py): Debian's package, the runtime
    state = parse_monitoring((CAPTURES / "twin-deployed.out").read_text().splitlines())
    assert state.python == "3.11" and state.exporter == "1.5.0-1+b6"
    assert state.exporter_active and state.timer_active
    assert state.runtime is not None and len(state.runtime) == 16
    assert state.metrics_age is not None and 0 <= state.metrics_age < 60


def test_unknown_lines_are_refused() -> None:
    with pytest.raises(ValueError, match="monitoring state"):
        parse_monitoring(["python=Python 3.11.2", "surprise=1"])
    with pytest.raises(ValueError, match="metrics_age"):
        parse_monitoring(["metrics_age=soon"])


# --- the runtime --------------------------------------------------------------------------------


def test_the_runtime_holds_the_audits_imports_and_none_of_the_control_side() -> None:
    pins = runtime.pins("3.11")
    names = {p.split("==")[0] for p in pins}
    assert {"pydantic", "pydantic-core", "jinja2", "markupsafe", "packaging"} <= names
    assert not names & {"pyinfra", "paramiko", "gevent", "pytest", "proxmoxer", "uv"}
    assert runtime.runtime_key("3.11") == runtime.runtime_key("3.11")
    assert runtime.runtime_key("3.11") != runtime.runtime_key("3.13")
    shipped = {name.split("/")[1] for name, _ in runtime._sources()}
    assert shipped == {"gpuhost", "files", "templates"}


def _pinned_modules(python: str) -> set[Path]:
    """The top-level modules and packages of the runtime's pinned distributions, here."""
    found = set()
    for pin in runtime.pins(python):
        dist = importlib.metadata.distribution(pin.split("==")[0])
        for file in dist.files or []:
            top = file.parts[0]
            if top.endswith((".dist-info", ".data")) or top == "..":
                continue
            found.add(Path(str(dist.locate_file(top))))
    return found


def test_what_the_timer_imports_needs_only_the_runtimes_pins(tmp_path: Path) -> None:
    """The install's own check on the host (deploys/monitoring.py) imports the audit, the
    planner and the metrics command: with gpuhost and the modules of the runtime's pins alone
    (no site-packages), as on the host, and nothing of the control side comes with them."""
    site = tmp_path / "site"
    site.mkdir()
    for path in _pinned_modules(f"{sys.version_info[0]}.{sys.version_info[1]}"):
        (site / path.name).symlink_to(path)
    for name, _ in runtime._sources():
        top = name.split("/")[1]
        if not (site / top).exists():
            (site / top).symlink_to(Path(__file__).parents[2] / top)
    code = (
        "import sys, gpuhost.audit.run, gpuhost.plan.make, gpuhost.cli, gpuhost.metrics.command\n"
        "assert not {'pyinfra', 'testinfra', 'paramiko', 'pytest', 'yaml'} & set(sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-s", "-S", "-c", code],
        env={"PYTHONPATH": str(site), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr


def test_the_plan_says_what_monitors_the_host() -> None:
    from gpuhost.plan.render import render_plan

    text = render_plan(make_plan("kpro6", spec(**ON), facts_with()))
    assert (
        "monitoring: gpuhost-metrics.timer every 120 s -> "
        "/var/lib/prometheus/node-exporter/gpuhost.prom (runtime for python 3.11), "
        "Debian's node_exporter" in text
    )
    assert "monitoring:" not in render_plan(make_plan("kpro6", spec(), facts_with()))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_takes_the_units(tmp_path: Path) -> None:
    """systemd's own parser (systemd-analyze verify) accepts the service and the timer as
    planned, the script path moved into the temporary directory (verify wants it there)."""
    script = tmp_path / "metrics"
    script.write_text(planmon.metrics_script("kpro6", "/var/lib/x/gpuhost.prom"))
    script.chmod(0o755)
    service = planmon.service_unit(300).replace("/usr/local/lib/gpuhost/metrics", str(script))
    (tmp_path / "gpuhost-metrics.service").write_text(service)
    (tmp_path / "gpuhost-metrics.timer").write_text(planmon.timer_unit(300))
    done = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            "--man=no",
            "gpuhost-metrics.timer",
            "gpuhost-metrics.service",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_a_cached_runtime_is_used_and_old_ones_go(tmp_path: Path) -> None:
    key = runtime.runtime_key("3.11")
    for i in range(runtime.KEEP + 3):
        old = tmp_path / f"old{i:02d}.tar.gz"
        old.write_bytes(b"")
        os.utime(old, (1000 + i, 1000 + i))
    (tmp_path / f"{key}.tar.gz").write_bytes(b"cached")
    assert runtime.build_runtime("3.11", tmp_path) == (key, tmp_path / f"{key}.tar.gz")
    runtime._prune(tmp_path)
    left = sorted(p.name for p in tmp_path.glob("*.tar.gz"))
    assert f"{key}.tar.gz" in left and len(left) == runtime.KEEP and "old00.tar.gz" not in left


def test_the_real_gpu_machine_that_ran_the_runtime() -> None:
    # tests/fixtures/captures/monitoring/h200-runtime: Ubuntu 24.04's python3 3.12, no dpkg
    # record of node_exporter (an empty answer), the runtime linked by hand as "k"
    lines = (CAPTURES / "h200-runtime/MonitoringState.out").read_text().splitlines()
    assert parse_monitoring(lines) == MonitoringState(python="3.12", runtime="k", runtime_age=7)
    log = (CAPTURES / "h200-runtime/run.log").read_text()
    assert log.count("rc=0") == 3 and "control side loaded: []" in log


def test_the_wheels_come_through_pip_or_else_uv(tmp_path: Path) -> None:
    site, req = tmp_path / "site", tmp_path / "requirements.txt"
    pip = runtime.install_command("3.13", site, req, pip=True)
    assert pip[1:4] == ["-m", "pip", "install"] and "--only-binary=:all:" in pip
    assert pip[pip.index("--abi") + 1] == "cp313" and "manylinux_2_36_x86_64" in pip
    uv = runtime.install_command("3.13", site, req, pip=False)
    assert Path(uv[0]).name == "uv" and "--no-build" in uv
    assert uv[uv.index("--python-platform") + 1] == "x86_64-manylinux_2_36"
    for cmd in (pip, uv):  # no index is named: the machine's own configuration picks it
        assert not [a for a in cmd if "index" in a or "://" in a]
