"""The Plan's trial boot: which step of it the host shows is due, and what its boot needs on
the command line. Pure: from the spec and the host's facts (kept apart from plan.py)."""

from __future__ import annotations

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.plan.trial.boot import TrialBoot, plan_trial_boot
from gpuhost.plan.trial.params import TRIAL_MARK
from gpuhost.plan.trial.state import RECORD as TRIAL_RECORD
from gpuhost.plan.trial.state import Step, TrialRecord, next_step
from gpuhost.spec.host import HostSpec


def plan_trial(
    spec: HostSpec,
    facts: HostFacts,
    problems: list[str],
    boot_due: bool = False,
    options: str = "",
) -> tuple[TrialBoot | None, Step, tuple[str, ...]]:
    """The trial boot due on this host, which of its steps the host shows is due, and the
    parameters to put on the managed command line for it.

    On systemd-boot and GRUB the trial boots an entry of its own (``options`` plus the panic
    parameters) and ``boot_due`` (the running kernel needs a boot for its command line or
    modules) starts a trial of the running kernel too; nothing goes on the managed command line.
    A trial that boots one of the loader's own entries (none today: the boot paths without a
    trial entry are refused) wants its panic parameters on the managed command line from the
    run that starts it until the one that commits it."""
    try:
        record = TrialRecord.parse((facts.files or {}).get(TRIAL_RECORD))
    except ValueError as exc:
        problems.append(str(exc))
        return None, Step.CONVERGED, ()
    running = facts.kernel.release
    pinned = facts.boot_kernels.pinned if facts.boot_kernels is not None else None
    booted = TRIAL_MARK in facts.cmdline
    step = next_step(record, spec.kernel.version, running, pinned, facts.boot_id, booted, boot_due)
    if step is Step.CONVERGED:
        return None, step, ()
    # The kernel the trial falls back to: recorded when it started, else the one running now
    # (or, on the planned kernel booted by other means, the pinned default it must replace).
    previous = record.previous if record else pinned if step is Step.GATE else running
    settings = spec.kernel.trial
    trial = plan_trial_boot(
        running=previous or running,
        kernel=spec.kernel.version,
        path=facts.boot_path,
        tool=facts.boot_tool,
        panic_timeout=settings.panic_timeout,
        deadline_minutes=settings.deadline_minutes,
        without_oneshot=settings.without_oneshot,
        options=options,
        own_entry=record is not None or step is Step.START,
    )
    due = step is Step.START or (step is Step.GATE and record is not None)
    on_cmdline = due and trial.can_apply and trial.entry_options is None
    return trial, step, trial.cmdline if on_cmdline else ()
