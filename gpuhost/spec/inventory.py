"""Inventory helpers: validate a host's spec when pyinfra loads the inventory file.

An inventory file declares hosts with :func:`gpu_host`; the spec is validated right there, at
import, before pyinfra connects anywhere. A bad spec stops the run with one message per problem
naming the inventory file, the host, the field, the bad value and what would be valid.

When pyinfra (or :func:`load_inventory`) loads an inventory file, everything below happens
before any connection:

- each :func:`gpu_host` call validates its spec (all problems at once) and refuses a host name
  that the same file already declared;
- the first :func:`gpu_host` call of a file also puts an empty group, ``gpuhost_inventory_check``,
  into the file's namespace. pyinfra iterates every module-level list of an inventory file to find
  its hosts, after the file has run; iterating this group checks the whole file: every host in
  every group must have been declared with :func:`gpu_host` (a plain ``"kpro7"`` or
  ``("kpro7", {...})`` has no spec), and no host name may be declared twice.
"""

from __future__ import annotations

import contextvars
import difflib
import os
import re
import runpy
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra.api.exceptions import InventoryError

from gpuhost.hostkeys import unknown_host_key
from gpuhost.redact import show
from gpuhost.spec.errors import describe
from gpuhost.spec.host import HostSpec
from gpuhost.spec.validate import InventoryFileError, SpecError, validate_spec

__all__ = ["describe"]  # re-exported: callers read spec errors through the inventory

SPEC_KEY = "gpuhost"  # host data key that holds the validated HostSpec
SOURCE_KEY = "gpuhost_source"  # host data key: the inventory file that declared the host
GUEST_KEY = "gpuhost_guest"  # host data key of a guest host (gpuhost/pve/guests.py)
CHECK_GROUP = "gpuhost_inventory_check"  # the (empty) group that checks a whole inventory file
_REGISTRY = "__gpuhost_hosts__"  # name -> entry, in the inventory file's namespace
# gpuhost's own host data (besides the spec): name -> (minimum, meaning)
GPUHOST_DATA = {
    "gpuhost_reboot_delay": (0, "seconds before the first reconnect after a reboot"),
    "gpuhost_reboot_timeout": (1, "seconds the host may take to come back"),
}
HOST_NAME_RE = re.compile(r"@?[A-Za-z0-9_\[][A-Za-z0-9_.:/@+\[\]-]{0,252}")


# --- gpu_host and the inventory-file check -----------------------------------------------------------


def _caller() -> types.FrameType:
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame


def _host_data_problems(host_data: dict[str, Any]) -> list[str]:
    problems = []
    for key, value in host_data.items():  # never echo a value: host data carries passwords
        if key in (SPEC_KEY, SOURCE_KEY):
            problems.append(f"host data {key!r} is set by gpu_host(); remove it")
        elif key.startswith("gpuhost_") and key not in GPUHOST_DATA:
            close = difflib.get_close_matches(key, list(GPUHOST_DATA), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else f"known: {', '.join(GPUHOST_DATA)}"
            problems.append(f"host data {key}: unknown gpuhost setting; {hint}")
        elif key in GPUHOST_DATA:
            minimum, meaning = GPUHOST_DATA[key]
            if type(value) is not int or value < minimum:
                problems.append(f"host data {key}: must be a whole number >= {minimum} ({meaning})")
    return problems


def gpu_host(
    name: str, spec: dict[str, Any] | None = None, source: str | None = None, **host_data: Any
) -> tuple[str, dict[str, Any]]:
    """An inventory entry ``(name, data)`` whose ``data["gpuhost"]`` is the validated spec.

    + name: the pyinfra host name (also the SSH host unless ``ssh_hostname`` is given)
    + spec: the host spec as plain data (see docs/reference/inventory.md)
    + source: the inventory file, for error messages (default: the caller's file)
    + host_data: other pyinfra host data, e.g. ``ssh_hostname``, ``ssh_user``; SSH host keys are
      verified (``ssh_strict_host_key_checking="yes"``) unless the host data says otherwise.
      Stored besides: ``gpuhost_source``, the inventory file.
    """
    frame = _caller()
    if source is None:
        source = frame.f_code.co_filename
    source = os.path.relpath(source) if os.path.isabs(source) else source
    shown = name if isinstance(name, str) and HOST_NAME_RE.fullmatch(name) else None
    if shown is None:
        raise SpecError(
            source,
            show(name) if not isinstance(name, str) else name[:60],
            [
                f"host name {show(name)} is not a pyinfra host name; write a host name, an "
                "address or an @connector name, e.g. 'kpro6' or '@local'"
            ],
        )
    problems = _host_data_problems(host_data)
    if spec is None:
        problems.insert(0, "no spec: gpu_host() needs spec={...} (see the inventory reference)")
    registry = _registry(frame, source)
    if registry is not None and name in registry:
        problems.insert(
            0,
            f"host {name!r} is declared twice in this inventory; declare each host once (put the "
            "same entry into several groups if it belongs to them)",
        )
    host_spec = spec if isinstance(spec, HostSpec) else None
    if spec is not None and host_spec is None:
        try:
            host_spec = validate_spec(source, name, spec)
        except SpecError as exc:
            problems += exc.all_problems
    if problems or host_spec is None:
        raise SpecError(source, name, problems)
    data = {"ssh_strict_host_key_checking": "yes", **host_data, SPEC_KEY: host_spec}
    data[SOURCE_KEY] = source
    _warn_unknown_host_key(name, data)
    entry = (name, data)
    if registry is not None:
        registry[name] = entry
    return entry


@dataclass(frozen=True, eq=False)
class BuildHost:
    """A build host as an inventory file declares it (:func:`build_host`). Not a pyinfra host:
    the pyinfra CLI never connects to it, gpuhost does when a build, or a deploy that installs
    a kernel from its store, needs it (gpuhost/build/host.py)."""

    name: str
    data: dict[str, Any]  # pyinfra host data: its ssh_* settings, the inventory file

    def __repr__(self) -> str:  # host data may hold a password: never shown
        return f"BuildHost({self.name!r})"


def build_host(name: str, source: str | None = None, **host_data: Any) -> BuildHost:
    """A build host: the machine a spec's ``artifacts.build_host`` names, where `gpuhost build`
    builds kernels into ``artifacts.store`` and where deploys take them from. Assign it to a
    variable of its own (``builder = build_host(...)``); deploys change nothing on it.

    + name: its name, the value of ``artifacts.build_host``
    + host_data: its SSH settings, as for :func:`gpu_host`; host keys are verified
    """
    frame = _caller()
    if source is None:
        source = frame.f_code.co_filename
    source = os.path.relpath(source) if os.path.isabs(source) else source
    problems = []
    if not (isinstance(name, str) and HOST_NAME_RE.fullmatch(name)):
        problems.append(f"name {show(name)} is not a host name; write a host name or address")
    problems += [p for p in _host_data_problems(host_data) if "gpu_host()" not in p]
    if SPEC_KEY in host_data:
        problems.append(f"host data {SPEC_KEY!r}: a build host has no spec; remove it")
    registry = _registry(frame, source)
    if registry is not None and name in registry:
        problems.append(f"host {name!r} is declared twice in this inventory; declare it once")
    if problems:
        raise InventoryFileError(source, [f"build host {show(name)}: {p}" for p in problems])
    declared = BuildHost(name, {"ssh_strict_host_key_checking": "yes", **host_data})
    declared.data[SOURCE_KEY] = source
    if registry is not None:
        registry[name] = declared
    return declared


_READ_FOR_SPECS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "gpuhost_read", default=False
)


def _warn_unknown_host_key(name: str, data: dict[str, Any]) -> None:
    """Under the pyinfra CLI (its State exists while the inventory loads, before it connects),
    say how to add a host key pyinfra is about to refuse; its own refusal does not say."""
    from pyinfra import logger
    from pyinfra.context import ctx_state

    if _READ_FOR_SPECS.get() or not ctx_state.isset():
        return
    if problem := unknown_host_key(name, data):
        logger.warning(f"gpuhost: {problem}")


def _registry(frame: types.FrameType, source: str) -> dict[str, Any] | None:
    """The per-run host registry of the inventory file being executed (not of imported modules:
    a module that is imported, e.g. a test, has a __spec__; a file pyinfra or runpy executes has
    none)."""
    namespace = frame.f_globals
    if namespace.get("__spec__") is not None:
        return None
    if _REGISTRY not in namespace:
        namespace[_REGISTRY] = {}
        namespace.setdefault(CHECK_GROUP, InventoryCheck(namespace, source))
    return namespace[_REGISTRY]


def _host_groups(namespace: dict[str, Any]) -> Iterator[tuple[str, list[Any]]]:
    """The groups pyinfra reads from an inventory file's namespace (its _is_inventory_group)."""
    for key, value in list(namespace.items()):
        if key.startswith("_") or isinstance(value, InventoryCheck):
            continue
        if isinstance(value, tuple) and value and isinstance(value[0], list):
            value = value[0]
        if isinstance(value, list | tuple) and all(isinstance(i, str | tuple) for i in value):
            yield key, list(value)


def inventory_problems(namespace: dict[str, Any]) -> list[str]:
    """Hosts without a gpuhost spec, and host names declared twice, in an executed inventory."""
    problems: list[str] = []
    declared: dict[str, int] = {}  # name -> id of the gpu_host() entry
    names: set[str] = set()
    plain: dict[str, str] = {}
    for group, hosts in _host_groups(namespace):
        for entry in hosts:
            if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], dict):
                name = entry[0]
                if isinstance(entry[1].get(SPEC_KEY), HostSpec) or GUEST_KEY in entry[1]:
                    if declared.get(name, id(entry)) != id(entry):
                        problems.append(
                            f"host {show(name)} is declared twice (group {group!r}); declare "
                            "each host once with gpu_host()"
                        )
                    declared.setdefault(name, id(entry))
                    continue
                plain.setdefault(name, group)
            elif isinstance(entry, str):
                names.add(entry)
                plain.setdefault(entry, group)
            else:
                plain.setdefault(show(entry), group)
    for name, group in plain.items():
        if name in declared and name in names:
            continue  # a reference by name to a host gpu_host() declared
        if name in declared:
            problems.append(
                f"host {show(name)} in group {group!r} has its own data besides its gpu_host() "
                "entry; put the gpu_host() entry itself into that group"
            )
        else:
            problems.append(
                f"host {show(name)} in group {group!r} has no gpuhost spec; declare it with "
                "gpuhost.spec.inventory.gpu_host(name, spec={...}) or move it to another inventory"
            )
    return problems + build_host_problems(namespace)


def build_hosts(namespace: dict[str, Any]) -> dict[str, BuildHost]:
    """The build hosts an executed inventory file declares (each a module-level variable)."""
    return {
        b.name: b
        for key, b in namespace.items()
        if isinstance(b, BuildHost) and not key.startswith("_")
    }


def build_host_problems(namespace: dict[str, Any]) -> list[str]:
    """Each build host is a variable of its own (pyinfra reads every list as a host group, and
    warns about or drops one holding anything else), and every ``artifacts.build_host`` names
    one this file declares."""
    problems = [
        f"{key!r} holds build_host() entries in a list; assign each build host to a variable "
        "of its own, e.g. builder = build_host(...): pyinfra reads lists as host groups"
        for key, value in namespace.items()
        if isinstance(value, list | tuple)
        and not isinstance(value, InventoryCheck)
        and any(isinstance(i, BuildHost) for i in value)
    ]
    builders = build_hosts(namespace)
    wanted: dict[str, str] = {}
    for _, hosts in _host_groups(namespace):
        for entry in hosts:
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], dict)):
                continue
            if isinstance(spec := entry[1].get(SPEC_KEY), HostSpec) and spec.artifacts.build_host:
                wanted.setdefault(entry[0], spec.artifacts.build_host)
    return problems + [
        f"host {show(name)}: artifacts.build_host = {show(builder)} is not a build host of this "
        f"inventory; declare it with builder = gpuhost.spec.inventory.build_host({builder!r}, "
        "ssh_hostname=...), or remove artifacts.build_host to build on the control machine"
        for name, builder in wanted.items()
        if builder not in builders
    ]


# source -> its build hosts, as the pyinfra CLI's read of that inventory file declared them
_CHECKED_BUILD_HOSTS: dict[str, dict[str, BuildHost]] = {}


def build_host_data(source: str, name: str) -> dict[str, Any]:
    """The host data of build host ``name`` that inventory file ``source`` declares: from the
    read that loaded it into pyinfra, else read again (the inventory check named it already)."""
    declared = _CHECKED_BUILD_HOSTS.get(source)
    if declared is None or name not in declared:
        return load_hosts(source)[1][name]
    return declared[name].data


class InventoryCheck(list):  # type: ignore[type-arg]
    """An empty host group that checks the whole inventory file when pyinfra reads it."""

    def __init__(self, namespace: dict[str, Any], source: str) -> None:
        super().__init__()
        self._namespace, self._source = namespace, source
        self._checked = False

    def check(self) -> None:
        if not self._checked:
            problems = inventory_problems(self._namespace)
            if problems:
                raise InventoryFileError(self._source, problems)
            _CHECKED_BUILD_HOSTS[self._source] = build_hosts(self._namespace)
            self._checked = True

    def __iter__(self) -> Iterator[Any]:
        self.check()
        return super().__iter__()

    def __len__(self) -> int:
        self.check()
        return 0


def load_inventory(path: str | Path) -> dict[str, tuple[HostSpec, dict[str, Any]]]:
    """Read an inventory file the way pyinfra does and return host -> (spec, other host data)."""
    return load_hosts(path)[0]


def load_hosts(
    path: str | Path,
) -> tuple[dict[str, tuple[HostSpec, dict[str, Any]]], dict[str, dict[str, Any]]]:
    """An inventory file's GPU hosts (name -> (spec, other data)) and build hosts (name -> data)."""
    token = _READ_FOR_SPECS.set(True)  # no connection follows from this read: no key hints
    try:
        namespace = runpy.run_path(str(path))
    finally:
        _READ_FOR_SPECS.reset(token)
    source = os.path.relpath(path) if os.path.isabs(path) else str(path)
    problems = inventory_problems(namespace)
    if problems:
        raise InventoryFileError(source, problems)
    hosts: dict[str, tuple[HostSpec, dict[str, Any]]] = {}
    for _, entries in _host_groups(namespace):
        for entry in entries:
            if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], dict):
                name, data = entry
                if isinstance(data.get(SPEC_KEY), HostSpec):
                    rest = {k: v for k, v in data.items() if k != SPEC_KEY}
                    hosts[name] = (data[SPEC_KEY], rest)
    if not hosts:
        raise InventoryError(
            f"{path}: no gpuhost hosts; declare them with gpuhost.spec.inventory.gpu_host()"
        )
    return hosts, {name: b.data for name, b in build_hosts(namespace).items()}
