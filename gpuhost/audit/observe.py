"""Read a host and its GPU guests for the audit: one command for the host, one per container.

The host command is the deploy's batched fact command (gpuhost.observe.hostfacts.FACTS) plus the facts
only the audit needs, so the Plan the audit checks against is made from exactly what the deploy
would see. Guests without SSH of their own are read through ``pct exec`` on the host.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuhost.guestsw.plan import planned_paths, venv_imports
from gpuhost.observe.cuda import DEFAULT_SIZES, CudaProbe, CudaView
from gpuhost.observe.devices import DeviceNode, NvidiaDeviceNodes
from gpuhost.observe.guest import LoginEnvironment
from gpuhost.observe.guestsoft import GuestFacts, commands, parse_guest
from gpuhost.observe.hostfacts import FACTS, HostFacts, combined_args, fact_tool, parse_raw
from gpuhost.observe.kernel import NvidiaModuleFiles
from gpuhost.observe.nvidia_driver import (
    FabricManager,
    GspFirmwareFiles,
    NvidiaFabricManager,
    NvidiaUserspace,
)
from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe
from gpuhost.observe.snapshot import MISSING_TOOL, Combined, split_combined
from gpuhost.observe.storage import StorageHealth, StorageHealthFact
from gpuhost.spec.guests import LxcGuest

# A command runner: command -> (exit status, stdout, stderr). testinfra's host.run, or a guest's.
Runner = Callable[[str], tuple[int, str, str]]

AUDIT_FACTS: dict[str, type[Probe]] = {
    "NvidiaDeviceNodes": NvidiaDeviceNodes,
    "GspFirmwareFiles": GspFirmwareFiles,
    "NvidiaUserspace": NvidiaUserspace,
    "NvidiaFabricManager": NvidiaFabricManager,
    "NvidiaModuleFiles": NvidiaModuleFiles,
    "StorageHealth": StorageHealthFact,
    "CudaProbe": CudaProbe,
}
# Facts read since the recorded audit captures were taken (tests/fixtures/captures): an output
# without all of them reads them as not captured (the host facts' defaults, no storage health).
# None since the retake of 2026-12-04 08:19 UTC (with MonitoringState and the readiness paths).
READ_SINCE_CAPTURES: frozenset[str] = frozenset()
# Facts whose command changed since the captures, each with the command the captures ran (its
# probe's earlier_commands). None: BootPath's Secure Boot reads (2026-12-05) print nothing on
# the lent machines (no /sys/firmware/efi), shown there beside the earlier command the same day.
CHANGED_SINCE_CAPTURES: dict[str, str] = {}
# The audit reads every fact the deploy reads (the Plan needs them all), in the same one command,
# but pve-container's version: it decides how the deploy may write devN entries, not what the
# audit checks (the entries that are there), and reads as "not captured" here.
HOST_FACT_KEYS = tuple(k for k in FACTS if k != "PveContainerVersion")
GUEST_FACTS: dict[str, type[Probe]] = {
    "NvidiaDeviceNodes": NvidiaDeviceNodes,
    "NvidiaUserspace": NvidiaUserspace,
    "LoginEnvironment": LoginEnvironment,
    "CudaProbe": CudaProbe,
}


@dataclass
class HostView:
    facts: HostFacts
    nodes: dict[str, DeviceNode]
    firmware: dict[str, list[str]]
    userspace: dict[str, list[str]]
    fabric: FabricManager
    modules: dict[str, dict[str, str]]
    cuda: CudaView | None  # None: python3 missing
    storage: StorageHealth | None = None  # None: not captured


@dataclass
class GuestView:
    nodes: dict[str, DeviceNode] = field(default_factory=dict)
    userspace: dict[str, list[str]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    cuda: CudaView | None = None
    unreachable: str | None = None  # why the guest could not be read (not running...)
    software: GuestFacts | None = None  # guest software (toolkits, venvs, services), if it has any


def _commands(
    facts: dict[str, type[Probe]], sizes: tuple[int, ...]
) -> list[tuple[str, str, str | None]]:
    out = []
    for key, cls in facts.items():
        fact = cls()
        command = fact.command(sizes=sizes) if cls is CudaProbe else fact.command()
        out.append((key, command, fact_tool(cls)))
    return out


def host_command(
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    without: frozenset[str] = frozenset(),
    earlier: dict[str, str] | None = None,
) -> str:
    """Every fact side by side, then the CUDA probe: libcuda makes missing device nodes (through
    nvidia-modprobe), so the nodes are read before CUDA can touch them. ``without``: facts left
    out, ``earlier``: facts' commands as they were (the command a capture recorded before)."""
    audit = {k: v for k, v in AUDIT_FACTS.items() if k not in without}
    facts = [c for c in _commands(audit, sizes) if c[0] != "CudaProbe"]
    probe = [c for c in _commands(audit, sizes) if c[0] == "CudaProbe"]
    keys = tuple(k for k in HOST_FACT_KEYS if k not in without)
    was = earlier or {}
    host = tuple((k, was.get(k, cmd), tool) for k, cmd, tool in combined_args(keys)["commands"])
    first = Combined().command(host + tuple(facts))
    return f"{first}\n{Combined().command(tuple(probe))}"


def guest_command(sizes: tuple[int, ...] = DEFAULT_SIZES, guest: LxcGuest | None = None) -> str:
    return Combined().command(tuple(_commands(GUEST_FACTS, sizes)) + _software(guest))


SOFTWARE = "sw:"  # key prefix of the guest software facts (gpuhost/observe/guestsoft.py)


def _software(guest: LxcGuest | None) -> tuple[tuple[str, str, str | None], ...]:
    """The guest software read (with import probes) for a guest that has any."""
    if guest is None or not (guest.cuda or guest.venvs):
        return ()
    paths, venvs, services = planned_paths(guest)
    imports = {v.path: tuple(i) for v, i in zip(guest.venvs, venv_imports(guest), strict=True)}
    return tuple(
        (SOFTWARE + key, cmd, tool) for key, cmd, tool in commands(paths, venvs, services, imports)
    )


def in_container(ctid: int, script: str) -> str:
    """``script`` run inside container ``ctid`` from the host (no SSH into the guest needed)."""
    return f"pct exec {int(ctid)} -- sh -c {shlex.quote(script)}"


def _parse(key: str, cls: type[Probe], rc: int, lines: list[str]) -> Any:
    if rc == MISSING_TOOL and fact_tool(cls):
        return None
    fact = cls()
    try:
        return fact.process(lines)
    except UnparsedOutput:
        raise
    except Exception as exc:  # a parser bug must name the fact, not vanish
        raise UnparsedOutput(key, "\n".join(lines[:3]), str(exc)) from exc


def _split(stdout: str) -> dict[str, tuple[int, list[str]]]:
    return split_combined(stdout.splitlines())


def observe_host(run: Runner, sizes: tuple[int, ...] = DEFAULT_SIZES) -> HostView:
    rc, stdout, stderr = run(host_command(sizes))
    raw = _split(stdout)
    missing = [k for k in (*HOST_FACT_KEYS, *AUDIT_FACTS) if k not in raw]
    if missing and set(missing) != READ_SINCE_CAPTURES:
        raise UnparsedOutput(
            "audit host command", f"exit {rc}: {stderr.strip()[-300:]}", f"no output for {missing}"
        )
    value = {k: _parse(k, cls, *raw[k]) for k, cls in AUDIT_FACTS.items() if k in raw}
    return HostView(
        facts=parse_raw({k: raw[k] for k in HOST_FACT_KEYS if k in raw}),
        nodes=value["NvidiaDeviceNodes"] or {},
        firmware=value["GspFirmwareFiles"] or {},
        userspace=value["NvidiaUserspace"] or {},
        fabric=value["NvidiaFabricManager"] or FabricManager(None, None),
        modules=value["NvidiaModuleFiles"] or {},
        cuda=value["CudaProbe"],
        storage=value.get("StorageHealth"),
    )


def observe_guest(
    run: Runner, sizes: tuple[int, ...] = DEFAULT_SIZES, guest: LxcGuest | None = None
) -> GuestView:
    rc, stdout, stderr = run(guest_command(sizes, guest))
    raw = _split(stdout) if "#gpuhost-fact=" in stdout else {}
    if not raw:
        why = (stderr or stdout).strip()[-300:] or f"exit status {rc}"
        return GuestView(unreachable=why)
    value = {k: _parse(k, cls, *raw[k]) for k, cls in GUEST_FACTS.items() if k in raw}
    software = {k.removeprefix(SOFTWARE): v for k, v in raw.items() if k.startswith(SOFTWARE)}
    return GuestView(
        nodes=value.get("NvidiaDeviceNodes") or {},
        userspace=value.get("NvidiaUserspace") or {},
        env=value.get("LoginEnvironment") or {},
        cuda=value.get("CudaProbe"),
        software=parse_guest(software) if software else None,
    )
