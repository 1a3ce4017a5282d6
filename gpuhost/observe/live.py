"""Read hosts live: every probe the planner reads, in one SSH round trip per host, over pyinfra.

The plain model and its parsers are :mod:`gpuhost.observe.hostfacts`; this module only connects.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError

from gpuhost.hostkeys import unknown_host_key
from gpuhost.observe.hostfacts import combined_args
from gpuhost.observe.snapshot import Combined
from gpuhost.spec.inventory import SPEC_KEY, load_inventory


def gather(hosts: list[tuple[str, dict]]) -> dict[str, dict[str, tuple[int, list[str]]]]:
    """Run every fact command on these (name, pyinfra host data) hosts, one round trip each."""
    unknown = [problem for name, data in hosts if (problem := unknown_host_key(name, data))]
    if unknown:
        raise PyinfraError("\n".join(unknown))
    # Built here rather than with pyinfra_cli, which monkey-patches the whole process (gevent).
    state = State(Inventory((hosts, {})), Config())
    connect_all(state)
    try:
        raw: dict[str, dict[str, tuple[int, list[str]]]] = {}
        for host in state.inventory.iter_activated_hosts():
            combined = Combined()
            ok, output = host.run_shell_command(combined.command(**combined_args()))
            if not ok:
                raise PyinfraError(
                    f"{host.name}: reading its facts failed: {' '.join(output.stderr_lines)[:200]}"
                )
            raw[host.name] = combined.process(output.stdout_lines)
        missing = [name for name, _ in hosts if name not in raw]
        if missing:
            raise PyinfraError(f"could not connect to {', '.join(missing)}")
        return raw
    finally:
        disconnect_all(state)


def gather_live(
    inventory: str, limit: str | None = None
) -> dict[str, dict[str, tuple[int, list[str]]]]:
    """Facts of an inventory file's hosts (or of pyinfra host names such as @local)."""
    if Path(inventory).is_file():
        entries = load_inventory(inventory).items()
        hosts = [(name, {**data, SPEC_KEY: spec}) for name, (spec, data) in entries]
    else:
        hosts = [(name, {}) for name in inventory.split(",")]
    return gather([h for h in hosts if not limit or h[0] == limit])
