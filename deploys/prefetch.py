"""Start a host's one batched read before the deploy imports the rest of gpuhost.

The read (deploys/context.py ``observed``) is one remote command that takes most of a converged
run's wait: the host runs every probe while this process would sit idle. pyinfra runs the deploy
file per host after connecting, so the file's first lines send that command in a greenlet; the
host works through it while this process imports the deploy's modules (about 0.1 s of CPU), and
``observed`` then takes the answer instead of asking again.
"""

from __future__ import annotations

import gevent
from pyinfra.api.host import Host

from facts.snapshot import Combined
from gpuhost.observe.hostfacts import combined_args

_pending: dict[tuple[int, str], gevent.Greenlet] = {}
# Turns of 1 ms given to the greenlet before the imports hold the CPU: opening the SSH channel
# and sending the command take two round trips (pyinfra has connected already). A command not
# sent in time is sent at the next yield, a little later: never lost.
SEND_TURNS = 4


def _real(host: Host) -> Host:
    get = getattr(host, "_get_module", None)  # pyinfra's context proxy: the Host behind it
    return get() if get is not None else host


def _key(host: Host) -> tuple[int, str]:
    return (id(host.state), host.name)


def start(host: Host) -> None:
    """Send ``host``'s batched read now (once per run); :func:`take` collects it."""
    real = _real(host)
    key = _key(real)
    if key in _pending:
        return
    _pending[key] = gevent.spawn(real.get_fact, Combined, **combined_args())
    for _ in range(SEND_TURNS):
        gevent.sleep(0.001)


def take(host: Host) -> dict[str, tuple[int, list[str]]] | None:
    """The read :func:`start` sent for ``host`` (waiting for it), or None if none was sent."""
    greenlet = _pending.pop(_key(_real(host)), None)
    return None if greenlet is None else greenlet.get()
