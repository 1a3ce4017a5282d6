"""The metrics timer's install: the deploy's operations (deploys/monitoring.py) on facts,
as tests/unit/test_operations.py does for the others: facts in, commands out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyinfra.context import ctx_host, ctx_state

from deploys import context, monitoring
from gpuhost.build import runtime
from gpuhost.plan import monitoring as planmon
from gpuhost.plan.make import make_plan
from tests.unit.test_monitoring_install import ON, facts_with, spec
from tests.unit.test_operations import FakeHost

# --- the deploy's operations --------------------------------------------------------------------


class MonitoredHost(FakeHost):
    def __init__(self, files: dict[str, Any], state: list[str]) -> None:
        super().__init__(files)
        self.state_lines = state

    def get_fact(self, cls: Any, **kwargs: Any) -> dict[str, tuple[int, list[str]]]:
        raw = super().get_fact(cls, **kwargs)
        raw["MonitoringState"] = (0, self.state_lines)
        return raw


def _run(op: Any, fake: FakeHost, **args: Any) -> list[str]:
    context._observed.clear()
    with ctx_host.use(fake), ctx_state.use(fake.state):
        return [
            c if isinstance(c, str) else c.get_raw_value()
            for c in op._inner(**args)
            if isinstance(c, str) or hasattr(c, "get_raw_value")
        ]


def _converged(key: str, **change: str) -> list[str]:
    state = {
        "python": "Python 3.11.2",
        "runtime": key,
        "exporter": "ii 1.5.0-1+b6",
        "exporter_active": "active",
        "timer_active": "active",
        "metrics_age": "30",
        **change,
    }
    return [f"{k}={v}" for k, v in state.items() if v is not None]


def _planned() -> tuple[Any, dict[str, Any]]:
    plan = make_plan("kpro6", spec(**ON), facts_with())
    held = {}
    for path in planmon.FILES:
        item = plan.files[path]
        if item.link is not None:
            held[path] = {"link": item.link}
        elif item.content is not None:
            held[path] = item.content
    return plan, held


def test_a_converged_host_gets_no_command() -> None:
    plan, held = _planned()
    key = runtime.runtime_key("3.11")
    fake = MonitoredHost(held, _converged(key))
    assert _run(monitoring.runtime_installed, fake, wanted=plan.monitoring) == []
    step = monitoring._step(plan.monitoring)
    assert _run(monitoring.started, fake, wanted=plan.monitoring, files=plan.files, step=step) == []
    assert len(fake.noops) == 3  # the package, the runtime, the timer


@pytest.mark.parametrize(
    ("change", "restart"),
    [
        ({"timer_active": "inactive"}, False),
        ({"metrics_age": None}, False),
        ({"exporter_active": "failed"}, True),
    ],
)
def test_what_the_host_lacks_starts_it_again(change: dict[str, Any], restart: bool) -> None:
    plan, held = _planned()
    fake = MonitoredHost(held, _converged(runtime.runtime_key("3.11"), **change))
    step = monitoring._step(plan.monitoring)
    commands = _run(monitoring.started, fake, wanted=plan.monitoring, files=plan.files, step=step)
    assert commands[0].endswith("touch /var/lib/gpuhost/pending-monitoring")
    assert (
        "systemctl start gpuhost-metrics.timer && systemctl start gpuhost-metrics.service"
        in (commands[1])
    )
    assert ("systemctl restart prometheus-node-exporter.service" in commands[1]) == restart
    assert commands[1].endswith("rm -f /var/lib/gpuhost/pending-monitoring")


def test_another_runtime_is_uploaded_and_switched_with_one_rename(tmp_path: Path) -> None:
    plan, held = _planned()
    fake = MonitoredHost(held, _converged("0123456789abcdef"))
    key = runtime.runtime_key("3.11")
    tarball = tmp_path / f"{key}.tar.gz"
    tarball.write_bytes(b"")  # a cached runtime: nothing is built here
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GPUHOST_RUNTIME_CACHE", str(tmp_path))
        context._observed.clear()
        with ctx_host.use(fake), ctx_state.use(fake.state):
            commands = list(monitoring.runtime_installed._inner(wanted=plan.monitoring))
    upload = commands[1]
    assert type(upload).__name__ == "FileUploadCommand"
    install = commands[2]
    assert f"tar -xzf /opt/gpuhost/.upload-{key}.tar.gz -C /opt/gpuhost/.{key}.part" in install
    assert "import gpuhost.audit.run, gpuhost.plan.make, gpuhost.cli" in install
    # the link moves last, by rename: a killed run leaves the old runtime in use
    assert install.index("mv -fT /opt/gpuhost/.current.new /opt/gpuhost/current") > install.index(
        "/usr/bin/python3 -s -c"
    )


def test_monitoring_turned_off_removes_what_it_installed() -> None:
    _, held = _planned()
    held[planmon.EXPORTER_DROPIN] = "[Service]\nExecStart=\n"
    fake = MonitoredHost(held, _converged("0123456789abcdef"))
    step = monitoring._step(None)
    commands = _run(monitoring.removed, fake, step=step, out="/var/lib/x/gpuhost.prom")
    assert commands == [
        "systemctl stop gpuhost-metrics.timer",
        "rm -rf /opt/gpuhost",
        "rm -f /var/lib/x/gpuhost.prom",
        "systemctl daemon-reload && systemctl try-restart prometheus-node-exporter.service && "
        "rm -f /var/lib/gpuhost/pending-monitoring",
    ]
    off = make_plan("kpro6", spec(), facts_with())
    assert all(not off.files[p].present for p in planmon.FILES)
