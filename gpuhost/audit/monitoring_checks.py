"""Host checks of the metrics timer (the spec's monitoring section, gpuhost/plan/monitoring.py):
its files, the runtime, the timer and node_exporter running, and metrics that are recent."""

from __future__ import annotations

from gpuhost.audit.context import REDEPLOY, AuditContext, file_findings
from gpuhost.audit.model import Finding, NotApplicable, check
from gpuhost.observe.monitoring import EXPORTER_PACKAGE, EXPORTER_UNIT, METRICS_TIMER
from gpuhost.paths import RUNTIME_LINK
from gpuhost.plan.monitoring import FILES, MonitoringPlan

STALE_SLACK = 60  # seconds a run may be late (start-up, AccuracySec) before the file is stale


def _wanted(ctx: AuditContext) -> MonitoringPlan:
    if ctx.plan.monitoring is None:
        raise NotApplicable("monitoring is off (monitoring.enabled: false)")
    if ctx.host.facts.monitoring is None:
        raise NotApplicable("the monitoring state was not captured")
    return ctx.plan.monitoring


@check("monitoring.timer", "The metrics timer, its runtime and node_exporter are in place")
def monitoring_timer(ctx: AuditContext) -> list[Finding]:
    wanted = _wanted(ctx)
    state = ctx.host.facts.monitoring
    assert state is not None
    findings = file_findings(ctx, [ctx.plan.files[p] for p in FILES], REDEPLOY)
    if state.runtime is None:
        findings.append(Finding(RUNTIME_LINK, "a link to the runtime", "missing", REDEPLOY))
    if not state.timer_active:
        findings.append(
            Finding(METRICS_TIMER, "active", "inactive", f"systemctl start {METRICS_TIMER}")
        )
    if wanted.node_exporter:
        if state.exporter is None:
            findings.append(Finding(EXPORTER_PACKAGE, "installed", "not installed", REDEPLOY))
        elif not state.exporter_active:
            findings.append(
                Finding(EXPORTER_UNIT, "active", "inactive", f"systemctl restart {EXPORTER_UNIT}")
            )
    return findings


@check("monitoring.fresh", "The metrics file was written within two timer intervals")
def monitoring_fresh(ctx: AuditContext) -> list[Finding]:
    wanted = _wanted(ctx)
    state = ctx.host.facts.monitoring
    assert state is not None
    limit = 2 * wanted.interval + STALE_SLACK
    fix = (
        f"see `systemctl status {METRICS_TIMER} gpuhost-metrics.service` and "
        "`journalctl -u gpuhost-metrics.service`"
    )
    if state.metrics_age is None:
        if state.runtime_age is not None and state.runtime_age <= limit:
            # the install's own run audits before it has written anything
            raise NotApplicable(f"installed {state.runtime_age} s ago; the first run writes it")
        return [Finding(wanted.out, f"written in the last {limit} s", "missing", fix)]
    ctx.details_for("monitoring.fresh")["age_seconds"] = state.metrics_age
    if state.metrics_age > limit:
        found = f"written {state.metrics_age} s ago"
        return [Finding(wanted.out, f"written in the last {limit} s", found, fix)]
    return []
