"""Fleet rollout: the hosts of a run are deployed one after another (kernel.trial.parallel opts
a host out), and a host that fails stops the rollout: the hosts after it change nothing.

Why not pyinfra's own knobs: pyinfra runs a deploy operation by operation across all hosts, so
with `_serial` on the trial operation alone every host would already have installed its new
kernel, modules and loader files before the first host's trial reboot, and `--serial` (host by
host) iterates a set (no inventory order) and goes on after a failed host. Instead each host's
whole deploy is one *turn*: its operations run under ``host.loop`` at the turn's position, and a
barrier operation, called from the same place by every host, closes each turn. pyinfra orders
operations as a topological sort of every host's operation sequence (``State.get_op_order``):
the barrier of turn k comes after the last operation of turn k's host and before the first one
of turn k+1's, so turns run strictly one after another, in inventory order. At execution the
barrier fails a later host, before any of its operations ran, once a host of an earlier turn
has failed.

Turns: every host with kernel.trial.parallel shares the first turn; every other host has a turn
of its own, in inventory order. A single host has one turn and no barrier.

This relies on the pyinfra CLI's operation identity (the call stack's line numbers plus the loop
position, pyinfra/api/operation.py solve_operation_consistency), which makes one barrier the
same operation on every host. Under pyinfra's Python API an operation is identified by its
index in each host's sequence instead, so there the turns would not be ordered; gpuhost's
deploys are run with the CLI.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pyinfra import logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.api.host import Host

from gpuhost.spec.inventory import SPEC_KEY

# Hosts that entered the rollout in a run (per pyinfra state): a host that failed to connect
# never does, and does not stop the others.
_entered: dict[int, set[str]] = {}


def assign_turns(hosts: Sequence[tuple[str, bool]]) -> dict[str, int]:
    """{host: turn} for (name, parallel) pairs in inventory order: the parallel hosts share
    turn 0, each other host gets the next turn of its own."""
    parallel = [name for name, together in hosts if together]
    turns = dict.fromkeys(parallel, 0)
    first = 1 if parallel else 0
    alone = [name for name, together in hosts if not together]
    turns.update({name: first + i for i, name in enumerate(alone)})
    return turns


def _fleet_turns(host: Host) -> dict[str, int]:
    state = host.state
    hosts = [  # GPU hosts only: guest hosts (gpuhost.pve.guests) take no turns
        h for h in state.inventory if h in state.activated_hosts and h.data.get(SPEC_KEY)
    ]
    return assign_turns([(h.name, bool(h.data.get(SPEC_KEY).kernel.trial.parallel)) for h in hosts])


def _stop_if_failed_before(turns: dict[str, int]):
    def check(state, host) -> bool:
        entered = _entered.get(id(state), set())
        failed = sorted(
            h.name
            for h in state.failed_hosts
            if h.name in entered and turns.get(h.name, 0) < turns[host.name]
        )
        if not failed:
            return True
        host.log_styled(
            f"not deployed: {', '.join(failed)} failed earlier in this rollout, so it stops "
            "here (hosts go one at a time; kernel.trial.parallel opts out). Nothing was changed "
            "on this host. Fix the failed host and run again",
            fg="red",
            log_func=logger.error,
        )
        return False

    return FunctionCommand(check, (), {})


@operation(is_idempotent=False)
def turn_done(turn: int, turns: dict[str, int]):
    """
    Close a rollout turn: the hosts of later turns wait for it, and stop here when a host of
    an earlier turn failed.

    + turn: the turn this barrier closes
    + turns: every host's turn (from :func:`assign_turns`)
    """
    from pyinfra import host, state

    if state.is_executing and turns[host.name] > turn:
        yield _stop_if_failed_before(turns)


def turns(host: Host) -> Iterator[int]:
    """Loop over this for the whole deploy of ``host``: it runs the body once, in the host's
    turn, with the barriers that order the turns around it."""
    fleet = _fleet_turns(host)
    mine, last = fleet[host.name], max(fleet.values())
    _entered.setdefault(id(host.state), set()).add(host.name)
    for turn in host.loop(range(mine + 1)):
        if turn == mine:
            yield turn
        if turn < last:
            names = ", ".join(sorted(n for n, t in fleet.items() if t == turn))
            turn_done(
                name=f"Rollout: turn {turn + 1} of {last + 1} ({names}) done",
                turn=turn,
                turns=fleet,
            )
