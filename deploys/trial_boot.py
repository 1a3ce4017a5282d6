"""The brick-safe trial boot of a new kernel: booted once through a true one-shot, proven by the
audit's host checks, and only then pinned as the default.

The steps and their exact commands are the Plan's (``plan.trial_boot``, see gpuhost/plan/trial/boot.py);
which step is due comes from the host alone (``plan.trial_step``, see gpuhost/plan/trial/state.py): its
trial record, the running kernel and the boot id. So a run killed anywhere converges on the next
one, and a trial that failed stops the deploy instead of being retried in a loop.

Order across the deploy (deploys/gpu_host.py):
  before_install  room on /boot and every ESP; pin the running kernel (nothing else can boot)
  (kernel and driver deploys install the new kernel and its modules)
  run_trial       sync the new kernel's entry to every ESP, arm the deadline, set and read back
                  the one-shot, record the trial, stop the guests, reboot, wait; then the gate
                  (the audit's host checks) and the commit, or back to the old kernel
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import OperationError, StringCommand, deploy, operation
from pyinfra.api.exceptions import DeployError

from deploys.context import observed
from deploys.guests import start_guests, stop_guests
from deploys.ops import mark_pending, write_command, write_file
from deploys.ops import step as _step
from deploys.reboot import read_fact, wait_for_boot
from gpuhost.observe.files import BootId
from gpuhost.plan.guests.power import GuestPower
from gpuhost.plan.make import Plan
from gpuhost.plan.model import FollowUp
from gpuhost.plan.trial.backstop import disarm
from gpuhost.plan.trial.params import TRIAL_MARK, settle_commands
from gpuhost.plan.trial.state import RECORD, Step, TrialRecord, failed_message
from gpuhost.spec.inventory import SOURCE_KEY, SPEC_KEY

JOURNAL = "journalctl -b -1 -k -n 40 --no-pager -o short-monotonic 2>/dev/null"


def _all(commands: tuple[str, ...]) -> str:
    """One shell command that runs ``commands`` in order and stops at the first failure, naming
    the command that failed (a silent `test` would otherwise leave only "Error")."""
    if not commands:
        return "true"
    return " && ".join(
        f"{{ ( {c} ) || {{ echo {shlex.quote(f'gpuhost: failed: {c}')} >&2; false; }}; }}"
        for c in commands
    )


def _run(host, command: str) -> tuple[bool, str]:
    ok, output = host.run_shell_command(StringCommand(command), print_output=False)
    return ok, "\n".join(output.stdout_lines + output.stderr_lines)


def _must(host, what: str, commands: tuple[str, ...]) -> None:
    for command in commands:
        ok, text = _run(host, command)
        if not ok:
            raise OperationError(f"{what}: `{command}` failed: {text.strip() or 'no output'}")


def _bring_back(host, guests: GuestPower | None) -> None:
    """After a failed trial, on the old kernel: the guests that ran before, as start_guests
    would (the deploy's own start operation does not run once the host has failed)."""
    if guests is not None and guests.start:
        _must(host, "bringing the guests back", tuple(start_guests._inner(power=guests)))


def preflight(plan: Plan) -> None:
    """Stop before anything changes when the trial cannot run or a previous one failed."""
    trial, step = plan.trial_boot, plan.trial_step
    if step is Step.FAILED:
        record = TrialRecord.parse(observed(host).files.get(RECORD))
        assert record is not None
        raise DeployError(failed_message(host.name, record, plan.running_kernel, None))
    if step in (Step.START, Step.GATE) and (trial is None or not trial.can_apply):
        reason = trial.refusal if trial is not None else "no trial boot was planned"
        raise DeployError(
            f"{host.name}: kernel {plan.target_kernel} cannot be trial-booted: {reason}"
        )


@operation()
def before_install(plan: Plan):
    """
    Before a new kernel is installed: room on /boot and every ESP, and the running kernel
    pinned, so that installing the new one (which would be the newest) cannot make it boot.

    + plan: the host's Plan (``trial_step``, ``trial_boot``)
    """
    trial = plan.trial_boot
    if plan.trial_step is not Step.START or trial is None:
        host.noop("no trial boot due")
        return
    yield _all(trial.checks)
    yield _all(trial.pin_running)


def _loader(plan: Plan) -> FollowUp:
    return next(f for f in plan.follow_ups if f.name == "loader")


def _initramfs(plan: Plan) -> FollowUp:
    return next(f for f in plan.follow_ups if f.name == "initramfs")


# The deadline's timer and its backstop (files/gpuhost-trial-backstop) stop once the gate
# starts: their reboot must not cut a commit in two.
DISARM = f"systemctl stop gpuhost-trial-deadline.timer && {disarm()}"


def _settle_cmdline(host, plan: Plan) -> None:
    """The loader files as the commit leaves them (the planned command line, without the
    trial's panic parameters), written before the commit: its refresh (or update-grub) applies
    them; a run killed in between refreshes on the next one."""
    mark = mark_pending([_loader(plan)])
    for item in plan.trial_commit_files.values():
        ok, output = host.run_shell_command(write_command(item, mark), print_output=False)
        if not ok:
            text = "\n".join(output.stderr_lines).strip()
            raise OperationError(f"writing {item.path} for the commit failed: {text}")


DRIVER_CHECKS = ("driver.version", "driver.compiler", "driver.firmware")


def _not_this_runs(plan: Plan) -> tuple[str, ...]:
    """Gate checks a trial of the running kernel does not set out to change: with the driver's
    modules left unmanaged (no driver.source) a driver the spec names but the host lacks is a
    later deploy's, and was so before this trial too (the audit still shows it)."""
    trial = plan.trial_boot
    same = trial is not None and trial.same_kernel and plan.driver_modules is None
    later = any(r.concern == "driver" for r in plan.reboot_later)
    return DRIVER_CHECKS if same and later else ()


def _drop_panic_parameters(host, plan: Plan) -> None:
    """Back on the old kernel after a failed trial, before its guests start: the live panic
    settings as planned, and where the trial had no entry of its own (its parameters went on
    the managed line every entry shares) the loader files without them, applied at once."""
    trial = plan.trial_boot
    assert trial is not None
    if trial.entry_options is None and plan.trial_commit_files:
        _settle_cmdline(host, plan)
        loader = _loader(plan)
        _must(host, "the loader without the trial's parameters", (loader.command,))
        _must(host, "clearing the pending loader refresh", (f"rm -f {shlex.quote(loader.marker)}",))
    _must(host, "setting the panic settings back", settle_commands(plan.panic_sysctls))


def _reboot(host) -> str:
    """Reboot detached (the SSH channel closes before the host goes down); the old boot id."""
    before = read_fact(host, BootId())
    if before is None:
        raise OperationError("cannot read the boot id before the reboot")
    host.run_shell_command(
        StringCommand("( sleep 1 && systemctl reboot ) </dev/null >/dev/null 2>&1 &"),
        print_output=False,
    )
    return before


def _gate_and_commit(
    host, plan: Plan, delay: int, timeout: int, guests: GuestPower | None = None
) -> None:
    """On the trial kernel: its checks and the audit gate; then pin it, or go back and fail."""
    trial = plan.trial_boot
    assert trial is not None
    spec = host.data.get(SPEC_KEY)
    problems: list[str] = []
    _must(host, "disarming the trial's deadline", (DISARM,))
    for command in trial.confirm:
        ok, text = _run(host, command)
        if not ok:
            problems.append(f"`{command}` failed{': ' + text.strip() if text.strip() else ''}")

    def runner(command: str) -> tuple[int, str, str]:
        ok, output = host.run_shell_command(StringCommand(command), print_output=False)
        return (0 if ok else 1, "\n".join(output.stdout_lines), "\n".join(output.stderr_lines))

    # With a trial entry the loader files are written by the commit, so the gate does not
    # compare them: /proc/cmdline (boot.cmdline) shows the entry booted the planned line.
    skip = ("boot.loader",) if trial.entry_options is not None else ()
    skip += _not_this_runs(plan)
    # The audit (its checks and their observers) loads only for a run that gates a trial boot,
    # not for every run.
    from gpuhost.audit.gate import run_gate

    gate = run_gate(host.name, spec, runner, host.data.get(SOURCE_KEY), skip=skip)
    problems += list(gate.failed)
    if not problems:
        _settle_cmdline(host, plan)
        _must(host, "committing the trial", trial.commit)
        markers = [_loader(plan).marker]
        if trial.entry_options is not None:  # the commit rebuilt the target's initramfs
            markers.append(_initramfs(plan).marker)
        _must(
            host,
            "clearing the pending loader refresh and initramfs rebuild",
            (f"rm -f {' '.join(shlex.quote(m) for m in markers)}",),
        )
        _must(host, "setting the panic settings back", settle_commands(plan.panic_sysctls))
        _must(host, "clearing the trial record", (f"rm -f {shlex.quote(RECORD)}",))
        logger.info(
            f"{host.print_prefix}{trial.what} passed its trial boot "
            f"({len(gate.passed)} host checks) and is now the default"
        )
        return
    # Back to the pinned kernel. The one-shot should be spent, but where GRUB could not clear
    # next_entry (a misdetected LVM /boot) it would start the trial kernel again: clear it first.
    logger.warning(f"{host.print_prefix}trial of {trial.what} failed its checks; going back")
    _must(host, "clearing the one-shot before going back", trial.abandon)
    before = _reboot(host)
    release = wait_for_boot(host, before, delay, timeout).kernel
    if release == trial.kernel and not trial.same_kernel:
        raise OperationError(
            f"the trial of {trial.kernel} failed its checks and a reboot started it again: the "
            f"boot loader's default is not {trial.running}. Fix the default by hand "
            f"(`proxmox-boot-tool kernel pin {trial.running}` and refresh). Checks:\n"
            + "\n".join(problems)
        )
    _must(host, "tidying up after the failed trial", trial.abandon)
    _drop_panic_parameters(host, plan)
    _bring_back(host, guests)
    raise OperationError(
        f"{trial.what} booted but failed the trial checks; the host is back on "
        f"{release} as it was (still the default). The record in {RECORD} keeps the next run from "
        "retrying: fix the cause, remove it and run again. Checks:\n" + "\n".join(problems)
    )


@operation(is_idempotent=False)
def run_trial(plan: Plan, delay: int = 10, timeout: int = 900, guests: GuestPower | None = None):
    """
    Boot the new kernel once, prove it with the audit's host checks, then pin it.

    + plan: the host's Plan (``trial_step``, ``trial_boot``)
    + delay, timeout: seconds before the first reconnect attempt, and overall per boot
    + guests: the running guests to shut down before the reboot (started again after it by
      :func:`deploys.guests.start_guests`, or here when the trial fails)
    """
    trial, step = plan.trial_boot, plan.trial_step
    if step is Step.GATE:
        yield _step(lambda state, host: _gate_and_commit(host, plan, delay, timeout))
        return
    if step is not Step.START or trial is None:
        host.noop(f"kernel {plan.running_kernel} is running and pinned; no trial boot due")
        return
    now = observed(host)
    record = TrialRecord(
        kernel=trial.kernel,
        previous=trial.running,
        boot_id=now.boot_id or "",
        deadline_s=trial.deadline_s,
        method=trial.method,
    )
    yield _all(trial.prepare)
    # The record before the one-shot: the deadline timer (files/gpuhost-trial-deadline) reads
    # it, so the one-shot is never set without its safety net.
    yield write_file(RECORD, record.render())
    if guests is not None:
        yield from stop_guests._inner(power=guests)
    yield _all(trial.oneshot)

    def reboot_into_trial(state, host) -> bool:
        logger.info(f"{host.print_prefix}rebooting into {trial.what} once ({trial.method})")
        before = _reboot(host)
        release = wait_for_boot(host, before, delay, timeout).kernel
        _, cmdline = _run(host, "cat /proc/cmdline")
        came_back = trial.same_kernel and TRIAL_MARK not in cmdline.split()
        if release != trial.kernel or came_back:
            _must(host, "tidying up after the failed trial", trial.abandon)
            _drop_panic_parameters(host, plan)
            _bring_back(host, guests)
            _, journal = _run(host, JOURNAL)
            raise OperationError(failed_message(host.name, record, release, journal.strip()))
        _gate_and_commit(host, plan, delay, timeout, guests)
        return True

    yield _step(reboot_into_trial)


@deploy("Trial boot")
def trial(plan: Plan) -> None:
    guests = plan.guest_power
    assert guests is not None  # a deploy's facts carry the guests' statuses
    # One host at a time across a fleet, and none after a failed one: deploys/rollout.py runs
    # each host's whole deploy in a turn of its own (kernel.trial.parallel shares the first).
    trial_boot = plan.trial_boot
    what = trial_boot.what if trial_boot is not None else f"kernel {plan.target_kernel}"
    run_trial(
        name=f"Trial boot: {what} once through the one-shot, checked, then the default",
        plan=plan,
        delay=int(host.data.get("gpuhost_reboot_delay", 10)),
        timeout=int(host.data.get("gpuhost_reboot_timeout", 900)),
        guests=guests,
    )
    start_guests(
        name="Bring back the guests that ran before the trial boot", power=guests, after_boot=True
    )
