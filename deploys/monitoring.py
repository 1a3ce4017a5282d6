"""The audit as metrics (the spec's monitoring section; gpuhost/plan/monitoring.py plans it).

- Debian's prometheus-node-exporter from the host's apt sources (its textfile collector reads
  /var/lib/prometheus/node-exporter by default), unless monitoring.node_exporter is false.
- The runtime the timer runs (gpuhost/build/runtime.py): built on this machine for the host's
  python3, uploaded only when the host's /opt/gpuhost/current does not name its key, unpacked
  beside the old one, imported once by the host's python3, then switched to with one rename of
  the link, so a run killed anywhere leaves the old runtime in use and the next run starts over.
- The Plan's files: the spec as JSON, the script, gpuhost-metrics.service and .timer (enabled
  through its timers.target.wants link), node_exporter's drop-in where the spec asks for one.
- Then, only when something above changed or the host shows the timer, node_exporter or the
  metrics file missing: systemd's reload, node_exporter (re)started, the timer started, and one
  run of the service, so the metrics are there when the deploy ends. A pending mark, written
  before the files change, makes a killed run do it next time.

With monitoring off, the files, the runtime, the metrics file and the timer go; the
node_exporter package stays (other collectors may use it).
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, deploy, operation
from pyinfra.api.exceptions import DeployError

from deploys.context import observed
from deploys.ops import as_planned, files_as_planned, managed_file, pending
from gpuhost.build.runtime import RuntimeBuildError, build_runtime, runtime_key
from gpuhost.observe.monitoring import (
    EXPORTER_PACKAGE,
    EXPORTER_UNIT,
    METRICS_TIMER,
    METRICS_UNIT,
    MonitoringState,
)
from gpuhost.paths import METRICS_SCRIPT, RUNTIME_DIR, RUNTIME_LINK, STATE_DIR
from gpuhost.plan.make import Plan
from gpuhost.plan.model import FollowUp, ManagedFile
from gpuhost.plan.monitoring import EXPORTER_DROPIN, FILES, METRICS_MODULE, MonitoringPlan

LABEL = "Monitoring"
q = shlex.quote


def _state() -> MonitoringState:
    return observed(host).monitoring or MonitoringState()


def _key(wanted: MonitoringPlan) -> str:
    if wanted.python is None:
        raise DeployError(
            f"{host.name}: monitoring.enabled needs python3 on the host (the metrics timer runs "
            "the audit with it); install Debian's python3 there (apt-get install python3), or "
            "set monitoring.enabled: false"
        )
    try:
        return runtime_key(wanted.python)
    except RuntimeBuildError as exc:
        raise DeployError(f"{host.name}: {exc}") from None


def _install_runtime(key: str, upload: str) -> str:
    """Unpack beside the runtime in use, prove the host's python3 imports it, then switch the
    link with one rename and remove the runtimes no link names."""
    part, link_new = f"{RUNTIME_DIR}/.{key}.part", f"{RUNTIME_DIR}/.current.new"
    return (
        f"rm -rf {q(part)} && mkdir -p {q(part)} && tar -xzf {q(upload)} -C {q(part)} && "
        f"cd / && PYTHONPATH={q(part + '/site')} /usr/bin/python3 -s -c "
        f"{q(f'import gpuhost.audit.run, gpuhost.plan.make, {METRICS_MODULE}')} && "
        f"rm -rf {q(f'{RUNTIME_DIR}/{key}')} && mv {q(part)} {q(f'{RUNTIME_DIR}/{key}')} && "
        f"ln -sfn {q(key)} {q(link_new)} && mv -fT {q(link_new)} {q(RUNTIME_LINK)} && "
        f"rm -f {q(upload)} && cd {q(RUNTIME_DIR)} && for d in * .*.part; do "
        f'[ -d "$d" ] && [ ! -L "$d" ] && [ "$d" != {q(key)} ] && rm -rf "$d"; done; true'
    )


@operation()
def runtime_installed(wanted: MonitoringPlan):
    """
    Install Debian's node_exporter when the spec wants it and the host lacks it; install the
    metrics runtime for the host's python3 unless /opt/gpuhost/current names its key.

    + wanted: the Plan's monitoring
    """
    state = _state()
    if wanted.node_exporter and state.exporter is None:
        apt = f"DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends {wanted.package}"
        # a host whose package lists are older than the mirror: update once, then install
        yield f"{apt} || {{ apt-get update -q && {apt}; }}"
    else:
        host.noop(f"{EXPORTER_PACKAGE} {state.exporter or 'not wanted'}")
    key = _key(wanted)
    if state.runtime == key:
        host.noop(f"{RUNTIME_LINK} is runtime {key} (python {wanted.python})")
        return
    try:
        _, tarball = build_runtime(wanted.python or "")
    except RuntimeBuildError as exc:
        raise DeployError(f"{host.name}: {exc}") from None
    upload = f"{RUNTIME_DIR}/.upload-{key}.tar.gz"
    yield f"mkdir -p {q(RUNTIME_DIR)}"
    yield FileUploadCommand(str(tarball), upload)
    yield _install_runtime(key, upload)


def _step(wanted: MonitoringPlan | None) -> FollowUp:
    """The start after a change: systemd's reload, node_exporter, the timer, one run."""
    commands = ["systemctl daemon-reload"]
    if wanted is not None:
        commands += [f"systemctl start {METRICS_TIMER}", f"systemctl start {METRICS_UNIT}"]
    return FollowUp("monitoring", " && ".join(commands), FILES)


def _exporter_restart(wanted: MonitoringPlan, files: dict[str, ManagedFile]) -> bool:
    """node_exporter must be (re)started: it is not running, or gpuhost's drop-in changes (or
    changed in a run that did not finish)."""
    if not wanted.node_exporter:
        return False
    state, managed = _state(), observed(host).managed
    dropin = files[EXPORTER_DROPIN]
    seen = managed.files.get(EXPORTER_DROPIN) if managed else None
    marker = _step(wanted).marker
    return (
        not state.exporter_active
        or seen != dropin.content
        or (managed is not None and marker in managed.files)
    )


@operation()
def started(wanted: MonitoringPlan, files: dict[str, ManagedFile], step: FollowUp):
    """
    Reload systemd, (re)start node_exporter, start the timer and run the service once, when a
    file or the runtime changed in this run, a previous run did not finish it, or the host
    shows the timer, node_exporter or the metrics file missing.

    + wanted: the Plan's monitoring
    + files: the Plan's files (the monitoring ones trigger the step)
    + step: the step (:func:`_step`)
    """
    state = _state()
    why = pending(step, files)
    if why is None and state.runtime != _key(wanted):
        why = "the runtime changes"
    if why is None and not state.timer_active:
        why = f"{METRICS_TIMER} is not active"
    if why is None and wanted.node_exporter and not state.exporter_active:
        why = f"{EXPORTER_UNIT} is not active"
    if why is None and state.metrics_age is None:
        why = f"{wanted.out} is missing"
    if why is None:
        host.noop(f"{METRICS_TIMER} active, {wanted.out} written {state.metrics_age} s ago")
        return
    host.log(f"{LABEL}: {why}", logger.info)
    yield f"mkdir -p {q(STATE_DIR)} && touch {q(step.marker)}"
    command = step.command
    if _exporter_restart(wanted, files):
        # enabled as its package's postinst does on a host with systemd running
        restart = f"systemctl enable {EXPORTER_UNIT} && systemctl restart {EXPORTER_UNIT}"
        command = command.replace(
            "systemctl daemon-reload", f"systemctl daemon-reload && {restart}"
        )
    yield f"{command} && rm -f {q(step.marker)}"


@operation()
def removed(step: FollowUp, out: str | None):
    """
    Monitoring is off: stop the timer, remove the runtime and the metrics file; node_exporter
    (kept) is restarted without gpuhost's drop-in where it had one.

    + step: the reload after the unit files went
    + out: the metrics file the old script wrote (None: none)
    """
    state, managed = _state(), observed(host).managed
    if state.timer_active:
        yield f"systemctl stop {METRICS_TIMER}"
    if state.runtime is not None:
        yield f"rm -rf {q(RUNTIME_DIR)}"
    if out is not None and state.metrics_age is not None:
        yield f"rm -f {q(out)}"
    command = f"{step.command} && rm -f {q(step.marker)}"
    if managed is not None and EXPORTER_DROPIN in managed.files:
        command = (
            f"{step.command} && systemctl try-restart {EXPORTER_UNIT} && rm -f {q(step.marker)}"
        )
    yield command


def _old_out() -> str | None:
    """The metrics file the host's script writes (its OUT= line), if the host has one."""
    managed = observed(host).managed
    text = managed.files.get(METRICS_SCRIPT, "") if managed else ""
    for line in text.splitlines():
        if line.startswith("OUT="):
            return shlex.split(line[4:])[0] if line[4:] else None
    return None


@deploy("Monitoring")
def configure(plan: Plan) -> None:
    wanted = plan.monitoring
    items = [plan.files[p] for p in FILES]
    settled = [i.path for i in items if as_planned(i)]
    step = _step(wanted)
    if wanted is None:
        state = _state()
        if len(settled) == len(items) and not (state.timer_active or state.runtime):
            return  # never monitored (or already removed): not even an operation
    else:
        runtime_installed(name=f"{LABEL}: node_exporter and the metrics runtime", wanted=wanted)
    if settled:
        files_as_planned(name=f"{LABEL}: {len(settled)} file(s) as planned", paths=settled)
    for item in items:
        if item.path not in settled:
            managed_file(name=f"{LABEL}: {item.path}", item=item, follow_ups=[step])
    if wanted is None:
        removed(name=f"{LABEL}: off: timer, runtime and metrics removed", step=step, out=_old_out())
    else:
        started(
            name=f"{LABEL}: {METRICS_TIMER} started, {METRICS_MODULE} run once",
            wanted=wanted,
            files=plan.files,
            step=step,
        )
