"""The audit as a pytest plugin (testinfra underneath): options, one test per check, reports.

    pytest tests/audit --inventory inventory/kpro6.py                  every host of the inventory
    pytest tests/audit --inventory inventory/kpro6.py --hosts=ssh://root@kpro6.lan
    gpuhost audit inventory/kpro6.py --json audit.json --junit audit.xml

Hosts are reached with testinfra's ssh backend; host keys are verified (StrictHostKeyChecking
stays on unless the inventory itself is a twin test inventory that says otherwise). Containers
without SSH of their own are read through ``pct exec`` on their host.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuhost.audit.connect import UnknownHostKey, guest_runners, host_runner, host_url
from gpuhost.audit.model import Check, Outcome
from gpuhost.audit.observe import Runner
from gpuhost.audit.run import HostAudit, cases, evaluate, read_host
from gpuhost.observe.cuda import DEFAULT_SIZES
from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import SOURCE_KEY, load_inventory


@dataclass
class Target:
    name: str
    spec: HostSpec
    data: dict[str, Any]
    url: str
    source: str | None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuhost audit")
    group.addoption("--inventory", help="gpuhost inventory file that describes the audited hosts")
    group.addoption("--audit-json", metavar="PATH", help="write the audit's JSON report here")
    group.addoption(
        "--p2p-sizes",
        default=",".join(str(s) for s in DEFAULT_SIZES),
        help="buffer sizes in bytes for the P2P copy check (default: %(default)s)",
    )
    group.addoption("--audit-limit", metavar="HOST", help="audit only this inventory host")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "audit: the testinfra audit of a real or simulated host")


def _targets(config: pytest.Config) -> list[Target]:
    inventory = config.getoption("inventory") or os.environ.get("GPUHOST_INVENTORY")
    entries = load_inventory(inventory)
    limit = config.getoption("audit_limit")
    hosts = getattr(config.option, "hosts", None) or []  # testinfra's --hosts: "a,b" or a list
    items = hosts.split(",") if isinstance(hosts, str) else [str(h) for h in hosts]
    urls = [u.strip() for item in items for u in item.split(",") if u.strip()]
    targets = []
    for name, (spec, data) in entries.items():
        if limit and name != limit:
            continue
        url = host_url(name, data)
        targets.append(Target(name, spec, data, url, data.get(SOURCE_KEY) or inventory))
    if urls == ["local://"]:  # the audit run on the host itself (testinfra's local backend)
        if len(targets) != 1:
            raise pytest.UsageError(
                f"--hosts=local:// audits one host: pick it with --audit-limit ({', '.join(t.name for t in targets)})"
            )
        return [
            Target(targets[0].name, targets[0].spec, targets[0].data, "local://", targets[0].source)
        ]
    if urls:
        chosen = []
        for url in urls:
            host = url.split("://", 1)[-1].rsplit("@", 1)[-1].split(":", 1)[0]
            match = [t for t in targets if host in (t.name, str(t.data.get("ssh_hostname")))]
            if not match:
                raise pytest.UsageError(f"--hosts {url}: no host {host!r} in {inventory}")
            chosen.append(Target(match[0].name, match[0].spec, match[0].data, url, match[0].source))
        targets = chosen
    if not targets:
        raise pytest.UsageError(f"{inventory}: no host to audit")
    return targets


def _host_runner(target: Target) -> Runner:
    try:
        return host_runner(target.name, target.data, target.url)
    except UnknownHostKey as exc:  # nothing connects: the message says how to add the key
        pytest.exit(str(exc), returncode=3)


class AuditSession:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.targets = _targets(config)
        self.sizes = tuple(int(s) for s in str(config.getoption("p2p_sizes")).split(",") if s)
        self.audits: dict[str, HostAudit] = {}
        self.errors: dict[str, str] = {}  # host -> why it could not be read
        self.outcomes: list[Outcome] = []
        self.started = time.time()

    def audit(self, target: Target) -> HostAudit:
        if target.name in self.errors:
            pytest.fail(self.errors[target.name], pytrace=False)
        if target.name not in self.audits:
            run = _host_runner(target)
            # A guest's unknown key: read_host raises it, and its host's checks fail with its message.
            guest_runner = guest_runners(target.name, target.data)
            try:
                self.audits[target.name] = read_host(
                    target.name, target.spec, run, guest_runner, self.sizes, target.source
                )
            except Exception as exc:  # one clear line per check, not a traceback each
                self.errors[target.name] = f"{target.name} could not be read: {exc}"
        if target.name in self.errors:
            pytest.fail(self.errors[target.name], pytrace=False)
        return self.audits[target.name]


_SESSION = pytest.StashKey[AuditSession]()


def _session(config: pytest.Config) -> AuditSession:
    if _SESSION not in config.stash:
        config.stash[_SESSION] = AuditSession(config)
    return config.stash[_SESSION]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "audit_case" not in metafunc.fixturenames:
        return
    if not (metafunc.config.getoption("inventory") or os.environ.get("GPUHOST_INVENTORY")):
        # Collected with the rest of a checkout's tests: nothing to audit, say how to run it.
        reason = "the audit needs the inventory that describes the host: --inventory FILE"
        metafunc.parametrize(
            "audit_case",
            [pytest.param(None, marks=pytest.mark.skip(reason=reason))],
            ids=["no-inventory"],
        )
        return
    session = _session(metafunc.config)
    params, ids = [], []
    for target in session.targets:
        for check, guest in cases(target.spec):
            params.append((target, check, guest))
            where = target.name if guest is None else f"{target.name}/{guest}"
            ids.append(f"{where}::{check.id}")
    metafunc.parametrize("audit_case", params, ids=ids, indirect=True)


@dataclass
class AuditCase:
    session: AuditSession
    target: Target
    check: Check
    guest: str | None

    def outcome(self) -> Outcome:
        outcome = evaluate(self.session.audit(self.target), self.check, self.guest)
        self.session.outcomes.append(outcome)
        return outcome


@pytest.fixture
def audit_case(request: pytest.FixtureRequest) -> AuditCase:
    target, check, guest = request.param
    return AuditCase(_session(request.config), target, check, guest)


def verify(case: AuditCase) -> None:
    """Run one check; skip it with its reason, or fail with every finding."""
    outcome = case.outcome()
    if outcome.skipped:
        pytest.skip(outcome.skipped)
    if outcome.findings:
        lines = [f"{case.check.title} ({outcome.target}): {len(outcome.findings)} finding(s)"]
        lines += [f.render() for f in outcome.findings]
        pytest.fail("\n".join(lines), pytrace=False)


def _report(session: AuditSession) -> dict[str, Any]:
    hosts = {}
    for name, audit in session.audits.items():
        hosts[name] = {
            "remote_commands": audit.commands,
            "read_seconds": round(audit.seconds, 3),
            "plan_refused": audit.refused.problems if audit.refused else None,
            "guests": audit.guest_access,
            "driver": audit.context.driver_version if audit.context else None,
            "kernel": audit.context.host.facts.kernel.release if audit.context else None,
        }
    results = [
        {
            "check": o.check.id,
            "title": o.check.title,
            "target": o.target,
            "status": o.status,
            "skipped": o.skipped,
            "findings": [f.__dict__ for f in o.findings],
            "details": o.details,
        }
        for o in session.outcomes
    ]
    counts = {s: sum(r["status"] == s for r in results) for s in ("passed", "failed", "skipped")}
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(session.started)),
        "seconds": round(time.time() - session.started, 3),
        "hosts": hosts,
        "summary": counts,
        "results": results,
    }


def pytest_sessionfinish(session: pytest.Session) -> None:
    audit = session.config.stash.get(_SESSION, None)
    path = session.config.getoption("audit_json")
    if audit is None or not path or not audit.outcomes:
        return
    Path(path).write_text(json.dumps(_report(audit), indent=2, sort_keys=True) + "\n")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    audit = config.stash.get(_SESSION, None)
    if audit is None or not audit.outcomes:
        return
    report = _report(audit)
    terminalreporter.section("gpuhost audit")
    for name, host in report["hosts"].items():
        terminalreporter.write_line(
            f"{name}: driver {host['driver']}, kernel {host['kernel']}; read in "
            f"{host['read_seconds']} s with {host['remote_commands']} remote command(s)"
        )
    summary = report["summary"]
    terminalreporter.write_line(
        f"checks: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['skipped']} not applicable"
    )
    for result in report["results"]:
        for finding in result["findings"]:
            terminalreporter.write_line(
                f"FAIL {result['target']} {result['check']}: {finding['subject']}: expected "
                f"{finding['expected']}; found {finding['found']}; fix: {finding['fix']}"
            )
