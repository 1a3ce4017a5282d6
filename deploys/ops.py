"""gpuhost's own pyinfra operations, in pyinfra's style: read state, compare, yield commands.

Each reads the host's state from the run's one batched fact (:func:`deploys.context.observed`)
and compares locally, so a converged re-run sends no per-item probes. Follow-up steps (boot
loader refresh, initramfs, daemon-reload) are decided from what the host shows: a pending-step
marker written before the files that need the step, removed when the step has succeeded.
"""

from __future__ import annotations

import base64
import posixpath
import shlex

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, OperationError, StringCommand, operation
from pyinfra.api.command import QuoteString
from pyinfra.api.util import format_text
from pyinfra.operations.util.files import generate_color_diff

from deploys.context import observed
from gpuhost.paths import STATE_DIR
from gpuhost.plan.make import Plan
from gpuhost.plan.model import FollowUp, ManagedFile


def _show_diff(path: str, current: str | None, wanted: str | None) -> None:
    """Print the change the way pyinfra's own file operations do (with --diff, the default)."""
    if not state.config.DIFF:
        return
    verb = "create" if current is None else "remove" if wanted is None else "modify"
    host.log(f"Will {verb} {format_text(path, bold=True)}", logger.info)
    before = (current or "").splitlines(keepends=True)
    after = (wanted or "").splitlines(keepends=True)
    for line in generate_color_diff(before, after):
        logger.info("  %s", line)
    logger.info("")


def step(function) -> FunctionCommand:
    """A FunctionCommand whose failure (OperationError) is reported as the run's error message,
    not as a Python traceback ("Unexpected error in Python callback")."""

    def run(state, host) -> bool:
        try:
            return function(state, host) is not False
        except OperationError as exc:
            host.log_styled(str(exc), fg="red", log_func=logger.error)
            return False

    return FunctionCommand(run, (), {})


def mark_pending(follow_ups: list[FollowUp]) -> list[str]:
    """Shell words that record ``follow_ups`` as pending before a trigger file changes."""
    if not follow_ups:
        return []
    markers = " ".join(shlex.quote(f.marker) for f in follow_ups)
    return [f"mkdir -p {shlex.quote(STATE_DIR)} && touch {markers} &&"]


@operation()
def managed_file(item: ManagedFile, follow_ups: list[FollowUp] | None = None):
    """
    Ensure a file holds exactly ``item.content`` (or is a symlink to ``item.link``), or is
    absent when neither is set.

    + item: the Plan's entry for the file
    + follow_ups: steps this file needs after a change; recorded as pending on the host first

    Files are written to a temporary name and renamed, so a crash never leaves half a file
    behind (a truncated /etc/kernel/cmdline makes a host unbootable).

    **Example:**

    .. code:: python

        managed_file(name="nvidia_uvm options", item=plan.files["/etc/modprobe.d/gpuhost-nvidia.conf"])
    """
    now = observed(host)
    managed = now.managed
    if managed is None:
        raise OperationError("the managed files were not read")
    path = item.path
    current, link = managed.files.get(path), managed.links.get(path)
    mark = mark_pending(follow_ups or [])
    if item.link is not None:
        if link == item.link:
            host.noop(f"{path} links to {item.link}")
            return
        host.log(f"Will link {format_text(path, bold=True)} -> {item.link}", logger.info)
        yield StringCommand(
            *mark,
            "mkdir -p",
            QuoteString(posixpath.dirname(path)),
            "&& ln -sfn",
            QuoteString(item.link),
            QuoteString(path),
        )
        return
    if item.content is None:
        if current is None and link is None:
            host.noop(f"{path} is absent")
            return
        _show_diff(path, current, None)
        yield StringCommand(*mark, "rm -f", QuoteString(path))
        return
    if current == item.content and link is None:
        host.noop(f"{path} is up to date")
        return
    _show_diff(path, current, item.content)
    yield write_command(item, mark)


def as_planned(item: ManagedFile) -> bool:
    """Whether the host held ``item`` as planned when the run started: its content (and no
    link), its link, or its absence. Exactly the cases where :func:`managed_file` yields nothing
    (tests/unit/test_operations.py holds them to that)."""
    managed = observed(host).managed
    if managed is None:
        return False  # managed_file stops with the reason
    current, link = managed.files.get(item.path), managed.links.get(item.path)
    if item.link is not None:
        return link == item.link
    if item.content is None:
        return current is None and link is None
    return current == item.content and link is None


@operation()
def files_as_planned(paths: list[str]):
    """
    Report the files of one concern that the host already holds as planned, in one operation:
    pyinfra inspects the call stack for every operation, and a converged run would otherwise
    pay that once per file. A file that must change gets its own :func:`managed_file`.

    + paths: the files, each as planned when the run started (:func:`as_planned`)
    """
    host.noop(f"{len(paths)} file(s) as planned: {', '.join(paths)}")
    yield from ()


@operation()
def step_settled(message: str):
    """
    Report a step of the Plan that has nothing to do in this run, in one operation where its
    operations would each report that they have nothing to do (see :func:`files_as_planned`).

    + message: what the step found, e.g. "no reboot needed, no guest to bring back"
    """
    host.noop(message)
    yield from ()


def write_file(path: str, text: str) -> str:
    """Write a short text file (gpuhost's records) atomically: a temporary file renamed over
    the path, so a run killed in between leaves the old record or the new one, never half."""
    q = shlex.quote
    tmp = f"{path}.gpuhost-new"
    return (
        f"mkdir -p {q(posixpath.dirname(path))} && printf %s {q(text)} > {q(tmp)} && "
        f"mv -fT {q(tmp)} {q(path)}"
    )


def write_command(item: ManagedFile, mark: list[str] | None = None) -> StringCommand:
    """Write ``item`` (content or absence) atomically: a temporary file renamed over the path,
    so a crash never leaves half a file behind (a truncated /etc/kernel/cmdline makes a host
    unbootable). ``mark``: shell words that run first (pending follow-ups)."""
    path = item.path
    if item.content is None:
        return StringCommand(*(mark or []), "rm -f", QuoteString(path))
    encoded = base64.b64encode(item.content.encode()).decode()
    tmp = f"{path}.gpuhost-new"
    return StringCommand(
        *(mark or []),
        "mkdir -p",
        QuoteString(posixpath.dirname(path)),
        "&& echo",
        encoded,
        "| base64 -d >",
        QuoteString(tmp),
        f"&& chmod {item.mode}",
        QuoteString(tmp),
        "&& mv -fT",
        QuoteString(tmp),
        QuoteString(path),
    )


def pending(step: FollowUp, files: dict[str, ManagedFile]) -> str | None:
    """Why ``step`` must run on this host now, or None: judged from the host's state."""
    now = observed(host)
    assert now.managed is not None
    if step.marker in now.managed.files:
        return "a previous run changed its files and did not finish it"
    changed = [
        path
        for path in step.triggers
        if path in files
        and (
            now.managed.files.get(path) != files[path].content
            or now.managed.links.get(path) != files[path].link
        )
    ]
    return f"{', '.join(changed)} change(s)" if changed else None


@operation()
def follow_up(step: FollowUp, files: dict[str, ManagedFile]):
    """
    Run a follow-up step (``step.command``) when the host needs it, then clear its marker.

    + step: the Plan's follow-up (name, command, trigger files)
    + files: the Plan's managed files, to see whether a trigger changes in this run
    """
    why = pending(step, files)
    if why is None:
        host.noop(f"{step.name}: nothing pending")
        return
    host.log(f"{step.command}: {why}", logger.info)
    yield f"{step.command} && rm -f {shlex.quote(step.marker)}"


def apply_files(
    plan: Plan,
    concern: str | tuple[str, ...],
    step_name: str,
    label: str,
    run_step: bool = True,
) -> None:
    """The Plan's files of one concern (or several), then the follow-up step they trigger.

    + concern: which of ``plan.files`` ("cmdline", "modules", "devices", "trial")
    + step_name: the follow-up of ``plan.follow_ups`` these files trigger
    + label: how the operations are named ("Kernel parameters: /etc/kernel/cmdline")
    + run_step: False leaves the step pending (marked) for the trial's commit to run
    """
    step = next(f for f in plan.follow_ups if f.name == step_name)
    concerns = (concern,) if isinstance(concern, str) else concern
    items = [item for item in plan.files.values() if item.concern in concerns]
    if run_step and settled_with(items, step, plan.files):
        paths = [item.path for item in items]
        name = f"{label}: {len(paths)} file(s) as planned, {step.command}: nothing pending"
        files_as_planned(name=name, paths=paths)
        return
    apply_items(items, label, [step])
    if run_step:
        follow_up(name=f"{step.command} when needed", step=step, files=plan.files)


def settled_with(items: list[ManagedFile], step: FollowUp, files: dict[str, ManagedFile]) -> bool:
    """Whether ``items`` are all as planned and ``step`` has nothing pending: then the files and
    the step are one operation that changes nothing (each otherwise one more stack walk)."""
    if observed(host).managed is None:
        return False  # managed_file stops with the reason
    return all(as_planned(item) for item in items) and pending(step, files) is None


def apply_items(items: list[ManagedFile], label: str, follow_ups: list[FollowUp]) -> None:
    """The files already as planned in one operation (:func:`files_as_planned`), each other
    file in its own, marking the follow-ups it triggers pending.

    + label: how the operations are named ("Kernel parameters: /etc/kernel/cmdline")
    + follow_ups: the Plan's follow-ups these files may trigger
    """
    settled = [item.path for item in items if as_planned(item)]
    if settled:
        files_as_planned(name=f"{label}: {len(settled)} file(s) as planned", paths=settled)
    for item in items:
        if item.path not in settled:
            steps = [f for f in follow_ups if item.path in f.triggers]
            managed_file(name=f"{label}: {item.path}", item=item, follow_ups=steps)
