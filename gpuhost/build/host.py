"""A build host (artifacts.build_host), reached through pyinfra's SSH connector.

`gpuhost build` connects to the build host the inventory declares (gpuhost.spec.inventory.build_host,
with its ssh_* data and a verified host key), uploads gpuhost's kernel build (the standard-library
modules gpuhost/build/remote.py lists) once per version of that code, and runs it there: the tree,
the base config, the compiler and the store are the build host's. Deploys read that store through
the same connection (gpuhost/build/remotestore.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import shlex
from pathlib import Path
from typing import Any

from pyinfra.api import Config, Host, Inventory, State
from pyinfra.api.command import StringCommand
from pyinfra.api.exceptions import PyinfraError

from gpuhost.build import remote as remotebuild
from gpuhost.hostkeys import unknown_host_key

PACKAGE_DIR = Path(__file__).parents[1]  # gpuhost/
# Where the uploaded build code lives on the build host: one directory per version of it.
CODE_ROOT = "/var/tmp/gpuhost-builder"


class BuildHostError(PyinfraError):
    """The build host could not be reached, or a command there failed; names host and cause."""


def connect(name: str, data: dict[str, Any]) -> Host:
    """A connected pyinfra host for the build host ``name`` (its inventory data ``data``), in
    a pyinfra State of its own: the pyinfra CLI's inventory never holds it."""
    inventory = Inventory(([(name, data)], {}))
    State(inventory=inventory, config=Config())
    host = inventory.get_host(name)
    try:
        ensure_connected(host)
    except BuildHostError as exc:
        hint = unknown_host_key(name, data)
        raise BuildHostError(f"{exc}{f'; {hint}' if hint else ''}") from None
    return host


def ensure_connected(host: Host) -> None:
    if host.connected:
        return
    try:
        host.connect(show_errors=False, raise_exceptions=True)
    except PyinfraError as exc:  # ConnectError, or a connector refusing its data (no key file)
        raise BuildHostError(f"build host {host.name}: cannot connect: {exc}") from None


def run(host: Host, command: str, timeout: int | None = None) -> str:
    """Run ``command`` on the build host; its stdout (raises with stderr when it fails)."""
    ensure_connected(host)
    ok, output = host.run_shell_command(StringCommand(command), _timeout=timeout)
    if not ok:
        raise BuildHostError(
            f"build host {host.name}: `{command[:200]}` failed: {output.stderr[-2000:]}"
        )
    return output.stdout


def code_version() -> str:
    h = hashlib.sha256()
    for name in remotebuild.MODULES:
        h.update(name.encode() + b"\0" + (PACKAGE_DIR / name).read_bytes())
    return h.hexdigest()[:16]


def upload_builder(host: Host) -> str:
    """The directory on the build host that holds this version of the build code (uploaded
    unless it is there: a marker file is written last, so a half upload is done again)."""
    q = shlex.quote
    base = f"{CODE_ROOT}/{code_version()}"
    if run(host, f"test -f {q(base)}/complete && echo yes || true").strip() == "yes":
        return base
    dirs = sorted({f"{base}/gpuhost/{Path(name).parent}" for name in remotebuild.MODULES})
    run(host, f"rm -rf {q(base)} && mkdir -p {' '.join(q(d) for d in dirs)}")
    for name in remotebuild.MODULES:
        if not host.put_file(str(PACKAGE_DIR / name), f"{base}/gpuhost/{name}"):
            raise BuildHostError(f"build host {host.name}: could not upload gpuhost/{name}")
    if not host.put_file(io.BytesIO(code_version().encode()), f"{base}/complete"):
        raise BuildHostError(f"build host {host.name}: could not write {base}/complete")
    return base


def build(host: Host, request: dict[str, Any]) -> dict[str, Any]:
    """Run one kernel build there (gpuhost/build/remote.py); its answer. A refusal raises with
    the build's own message. A dropped connection leaves the build running there to its end
    (no terminal: nothing hangs it up); the next `gpuhost build` waits for it on the inputs'
    lock (gpuhost.build.kernel.building) and finds its result."""
    base = upload_builder(host)
    q = shlex.quote
    command = f"cd {q(base)} && python3 -m gpuhost.build.remote {q(remotebuild.encode(request))}"
    ensure_connected(host)
    _, output = host.run_shell_command(StringCommand(command))
    lines = output.stdout_lines
    try:
        answer = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise BuildHostError(
            f"build host {host.name}: the build gave no answer (is python3 installed there?): "
            f"{output.stderr[-2000:] or output.stdout[-2000:]}"
        )
    if not answer.get("ok"):
        raise BuildHostError(f"build host {host.name}: {answer.get('error')}")
    return answer
