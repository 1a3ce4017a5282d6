"""What `gpuhost rehearse` reports from the runs on the twin: pyinfra's results table (what ran
and what changed), the reboots and trial boots the deploy logged and how each ended, and the
audit's JSON report in a few lines."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# What deploys/reboot.py and deploys/trial_boot.py log about boots they cause, and how they end.
BOOT_LINES = (
    "rebooting now",  # a plain reboot (reboot.py), confirmed by "...kernel command line confirmed"
    "kernel command line confirmed",
    "rebooting into",  # a trial boot through the one-shot (trial_boot.py)
    "passed its trial boot",
    "failed its checks; going back",
    "booted but failed the trial checks",
    "not rebooting again",
    "did not come back",
)


@dataclass
class Operation:
    name: str
    changed: int
    failed: int
    unchanged: int


@dataclass
class RunSummary:
    """One pyinfra run of a deploy, read from its output."""

    rc: int
    operations: list[Operation] = field(default_factory=list)
    boots: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return sum(op.changed for op in self.operations)

    @property
    def failures(self) -> int:
        return sum(op.failed for op in self.operations)


def _count(cell: str) -> int:
    return 0 if cell == "-" else int(cell)


def summarise(rc: int, output: str) -> RunSummary:
    """pyinfra's output: its results table (Operation, Hosts, Success, Error, No Change; Success
    is the hosts the operation changed), the boot lines and the error lines."""
    text = ANSI.sub("", output)
    run = RunSummary(rc)
    head, _, table = text.partition("--> Results:")
    for line in table.splitlines():
        cells = line.split()
        if len(cells) < 5 or cells[-4:] == ["Hosts", "Success", "Error", "Change"]:
            continue
        if not all(c == "-" or c.isdigit() for c in cells[-4:]):
            continue
        name = " ".join(cells[:-4])
        if name == "Grand total":
            continue
        run.operations.append(
            Operation(name, _count(cells[-3]), _count(cells[-2]), _count(cells[-1]))
        )
    lines = head.splitlines()
    for at, line in enumerate(lines):
        stripped = line.strip()
        if any(marker in stripped for marker in BOOT_LINES):
            run.boots.append(stripped)
            if stripped.endswith("Checks:"):  # the gate's failures follow, one block each
                run.boots.append(f"  failed checks: {_checks(lines[at + 1 :])}")
        elif stripped.startswith(("--> pyinfra error", "--> An unexpected")) or "Error:" in line:
            run.errors.append(stripped)
    return run


def _checks(lines: list[str]) -> str:
    """The check names of a failed trial's list ("check: subject:" then indented lines)."""
    counts: dict[str, int] = {}
    for line in lines:
        if line.startswith((" ", "-")) or not line.strip():
            if line.lstrip().startswith(("[", "-->")):
                break
            continue
        name = line.split(":", 1)[0]
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{name} ({n})" for name, n in counts.items()) or "none listed"


def render_run(run: RunSummary, log: Path) -> list[str]:
    if run.operations:
        said = f"{len(run.operations)} operations: {run.changes} changed, {run.failures} failed"
    else:  # pyinfra prints no results table after a run that stopped
        said = "stopped with an error before pyinfra's results table"
    lines = [f"{said} (exit {run.rc}; pyinfra's output: {log})"]
    lines += [f"  changed: {op.name}" for op in run.operations if op.changed]
    lines += [f"  FAILED:  {op.name}" for op in run.operations if op.failed]
    lines += [f"  {line}" for line in run.errors[:10]]
    return lines


def render_boots(runs: list[RunSummary]) -> list[str]:
    lines = [f"  {line}" for run in runs for line in run.boots]
    return lines or ["  none: the deploy booted the twin at no point"]


@dataclass
class AuditSummary:
    rc: int
    counts: dict[str, int]
    failed: list[str]


def summarise_audit(rc: int, report: Path) -> AuditSummary:
    """The audit's JSON report (`gpuhost audit --json`): results by status, failures named."""
    if not report.is_file():
        return AuditSummary(rc, {}, [f"no report written (exit {rc}); see the audit log"])
    results = json.loads(report.read_text()).get("results", [])
    counts: dict[str, int] = {}
    failed = []
    for result in results:
        status = str(result.get("status"))
        counts[status] = counts.get(status, 0) + 1
        if status not in ("passed", "skipped", "not_applicable"):
            findings = result.get("findings") or [{}]
            line = f"{result.get('check')} ({result.get('target')}): {status}"
            failed.append(line + _finding(findings[0]) + _more(len(findings) - 1))
    return AuditSummary(rc, counts, failed)


def _finding(finding: object) -> str:
    if not isinstance(finding, dict) or not finding:
        return f": {str(finding)[:200]}" if finding else ""
    said = f"{finding.get('subject')}: expected {finding.get('expected')}, found {finding.get('found')}"
    return f": {said[:200]}"


def _more(count: int) -> str:
    return f" (and {count} more)" if count > 0 else ""


def render_audit(audit: AuditSummary, report: Path) -> list[str]:
    counts = ", ".join(f"{n} {status}" for status, n in sorted(audit.counts.items()))
    lines = [f"{counts or 'no results'} (exit {audit.rc}; report: {report})"]
    return lines + [f"  {line}" for line in audit.failed]
