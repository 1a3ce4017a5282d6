"""Guest software: CUDA toolkits, uv venvs with pins, the managed environment, services.

Each operation compares the guest plan (gpuhost/guestsw/plan.py), made once per run from one
batched read of the guest (gpuhost/observe/guestsoft.py) and the node's Plan, and yields only what must
change; a converged guest costs that one read (and the node's) and no per-item probes.
"""

from __future__ import annotations

import io
import shlex
from pathlib import Path

from pyinfra import host, logger, state
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.api.exceptions import DeployError
from pyinfra.api.host import Host

from deploys import context
from deploys.ops import _show_diff, write_command
from facts.snapshot import Combined
from gpuhost.guestsw.control import control_for
from gpuhost.guestsw.model import (
    KEYRING,
    SOURCES,
    GuestPlan,
    GuestPlanError,
    ServicePlan,
    VenvPlan,
)
from gpuhost.guestsw.plan import make_guest_plan, planned_paths
from gpuhost.guestsw.render import render_guest_plan
from gpuhost.observe.guestsoft import STAMP, UV_PATH, GuestFacts, commands, parse_guest
from gpuhost.observe.snapshot import Commands
from gpuhost.plan.guests.split import owner_of_guest
from gpuhost.plan.make import make_plan
from gpuhost.plan.model import ManagedFile, PlanError
from gpuhost.pve.guests import GuestEntry
from gpuhost.spec.guests import LxcGuest
from gpuhost.spec.inventory import GUEST_KEY, SOURCE_KEY, SPEC_KEY

BIG = 32 << 10  # files longer than this are uploaded, not echoed in a command
_facts: dict[tuple[int, str], GuestFacts] = {}
_plans: dict[tuple[int, str], GuestPlan] = {}


def _key(host: Host) -> tuple[int, str]:
    return (id(host.state), host.name)


def _spec(host: Host) -> tuple[GuestEntry, LxcGuest]:
    entry = host.data.get(GUEST_KEY)
    if not isinstance(entry, GuestEntry) or not isinstance(entry.spec, LxcGuest):
        raise DeployError(
            f"{host.name}: not a GPU container of the inventory (guests come from "
            "gpuhost.pve.guests.guests_of; only lxc guests the spec names get software)"
        )
    return entry, entry.spec


def guest_facts(host: Host) -> GuestFacts:
    """The guest's state, from one remote command, cached for the run."""
    key = _key(host)
    if key not in _facts:
        _, guest = _spec(host)
        paths, venvs, services = planned_paths(guest)
        raw = host.get_fact(Combined, commands=Commands(commands(paths, venvs, services)))
        _facts[key] = parse_guest(raw)
    return _facts[key]


def guest_plan(host: Host) -> GuestPlan:
    """The guest's software plan (made and printed once per run); refused before any change."""
    key = _key(host)
    if key not in _plans:
        entry, guest = _spec(host)
        node = state.inventory.get_host(entry.node_host)
        try:  # the node's Plan, not printed: only its environment for this guest is used
            node_plan = make_plan(
                node.name,
                node.data.get(SPEC_KEY),
                context.observed(node),
                node.data.get(SOURCE_KEY),
            )
        except PlanError as exc:
            raise DeployError(f"{host.name}: its node's plan is refused:\n{exc}") from None
        env = node_plan.guest_env.get(owner_of_guest(guest), {})
        try:
            made = make_guest_plan(host.name, guest, env, guest_facts(host), control_for(guest))
        except GuestPlanError as exc:
            raise DeployError(str(exc)) from None
        logger.info(f"{host.print_prefix}\n{render_guest_plan(made)}")
        _plans[key] = made
    return _plans[key]


@operation()
def guest_file(item: ManagedFile):
    """
    Ensure a guest file holds exactly ``item.content`` (absent when None), written atomically.

    + item: the guest plan's entry for the file
    """
    current = guest_facts(host).files.files.get(item.path)
    if current == item.content:
        host.noop(f"{item.path} is {'up to date' if current is not None else 'absent'}")
        return
    if item.content is not None and len(item.content) > BIG:
        # too long for one command line (a CA bundle): uploaded, then renamed into place
        host.log(f"Will write {item.path} ({len(item.content)} bytes)", logger.info)
        tmp = f"{item.path}.gpuhost-new"
        yield StringCommand("mkdir -p", shlex.quote(str(Path(item.path).parent)))
        yield FileUploadCommand(io.BytesIO(item.content.encode()), tmp)
        yield f"chmod {item.mode} {shlex.quote(tmp)} && mv -fT {shlex.quote(tmp)} {shlex.quote(item.path)}"
        return
    if item.mode == "600":  # holds secret-named variables: never printed
        host.log(f"Will write {item.path} (root only; its content is not shown)", logger.info)
    else:
        _show_diff(item.path, current, item.content)
    yield write_command(item)


APT_ONLY_CUDA = (
    "-o Dir::Etc::sourcelist={sources} -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0"
)


@operation()
def toolkits(plan: GuestPlan, sources: str):
    """
    Install the planned CUDA toolkits that are missing, from the spec's repository only.

    + plan: the guest plan
    + sources: the managed deb822 source: `apt-get update` reads that one alone
    """
    if not plan.install_toolkits:
        host.noop(f"CUDA {', '.join(t.version for t in plan.toolkits)} installed")
        return
    only = APT_ONLY_CUDA.format(sources=shlex.quote(sources))
    packages = " ".join(shlex.quote(p) for p in plan.install_toolkits)
    yield (
        # dpkg --configure -a: a run killed inside dpkg leaves packages half-configured
        f"export DEBIAN_FRONTEND=noninteractive && dpkg --configure -a && apt-get update -q {only} && "
        f"apt-get install -y -q --no-install-recommends {packages}"
    )


@operation()
def cuda_default(plan: GuestPlan):
    """
    Point /usr/local/cuda at the spec's default toolkit (the `cuda` alternative, manual mode).

    + plan: the guest plan
    """
    default = plan.default
    if default is None:
        return
    if not plan.set_default:
        host.noop(f"/usr/local/cuda -> {default.prefix}")
        return
    yield f"update-alternatives --set cuda {shlex.quote(default.prefix)}"


@operation()
def uv_binary(plan: GuestPlan):
    """
    Put the control machine's uv at /usr/local/bin/uv (compared by sha256).

    + plan: the guest plan
    """
    if not plan.push_uv or plan.uv_path is None:
        host.noop(f"{UV_PATH} is the control machine's uv")
        return
    tmp = f"{UV_PATH}.gpuhost-new"
    yield StringCommand("mkdir -p", shlex.quote(str(Path(UV_PATH).parent)))
    yield FileUploadCommand(plan.uv_path, tmp)
    yield f"chmod 755 {tmp} && mv -f {tmp} {UV_PATH}"


_PIN_CHECK = (
    "import sys, importlib.metadata as m\n"
    "bad = []\n"
    "for arg in sys.argv[1:]:\n"
    "    name, _, want = arg.partition('==')\n"
    "    try:\n"
    "        found = m.version(name)\n"
    "    except m.PackageNotFoundError:\n"
    "        found = 'missing'\n"
    "    if found != want:\n"
    "        bad.append(f'{name} {found} (pinned {want})')\n"
    "if bad:\n"
    "    sys.exit('gpuhost: pinned packages moved: ' + ', '.join(bad))\n"
)


def _exports(env: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)} && " for k, v in sorted(env.items()))


def install_command(venv: VenvPlan, uv_env: dict[str, str]) -> str:
    """uv pip install with the pins as constraints, then the pins and the imports checked, then
    the stamp that says this venv holds this install (written last: a killed run reinstalls)."""
    q = shlex.quote
    python = q(f"{venv.path}/bin/python")
    pins = " ".join(q(f"{n}=={v}") for n, v in venv.pins.items()) or "none"
    refused = (
        f"gpuhost: {venv.path}: refused: a package would move a pin of {venv.constraints} "
        f"({pins}); uv's explanation above names the package and the versions. Nothing was "
        "changed in the venv."
    )
    failed = f"gpuhost: {venv.path}: uv pip install failed (its output is above)"
    steps = [
        f"{_exports(uv_env)}. {q(venv.env_sh)}",
        f"if ! out=$(uv pip install --python {python} -r {q(venv.requirements)} "
        f"-c {q(venv.constraints)} 2>&1); then printf '%s\\n' \"$out\" >&2; "
        f"case \"$out\" in *'No solution found'*) echo {q(refused)} >&2;; "
        f"*) echo {q(failed)} >&2;; esac; exit 1; fi",
        "printf '%s\\n' \"$out\"",
    ]
    if venv.pins:
        steps.append(f"{python} -c {q(_PIN_CHECK)} {pins}")
    if venv.imports:
        failed = f"gpuhost: {venv.path}: the import check failed ({', '.join(venv.imports)})"
        steps.append(
            f"{python} -c {q('import ' + ', '.join(venv.imports))} || "
            f"{{ echo {q(failed)} >&2; exit 1; }}"
        )
    steps.append(f"echo {venv.stamp} > {q(venv.path + '/' + STAMP)}")
    return " && ".join(steps)


@operation()
def venv(plan: VenvPlan, uv_env: dict[str, str]):
    """
    Make the venv with its python, hook its activation, install its requirements under its pins.

    + plan: the guest plan's venv
    + uv_env: environment for uv itself (the indexes' CA bundle)
    """
    q = shlex.quote
    if plan.create:
        failed = (
            f"gpuhost: uv could not make a Python {plan.python} venv at {plan.path}: it uses an "
            f"installed python {plan.python} or downloads one (python-build-standalone); install "
            "it in the guest, or ask for the guest's system python version"
        )
        yield (
            f"{_exports(uv_env)}rm -rf {q(plan.path)} && uv venv -q --python {q(plan.python)} {q(plan.path)} "
            f"|| {{ echo {q(failed)} >&2; exit 1; }}"
        )
    if plan.hook:
        yield f"printf '\\n. %s  # gpuhost\\n' {q(plan.env_sh)} >> {q(plan.path + '/bin/activate')}"
    if plan.install:
        host.log(f"{plan.path}: install ({plan.install})", logger.info)
        yield install_command(plan, uv_env)
    if not (plan.create or plan.hook or plan.install):
        host.noop(f"{plan.path} holds its requirements at their pins")


@operation()
def service(plan: ServicePlan):
    """
    Enable the venv's service and (re)start it when it is not running the planned state.

    + plan: the guest plan's service

    Restarted only when it is not active or when the stamp it was started with (unit,
    environment and venv install) differs from the plan's; recorded after it is active.
    """
    q = shlex.quote
    if plan.enable:
        yield f"systemctl daemon-reload && systemctl enable {q(plan.unit)}"
    if plan.restart:
        host.log(f"{plan.unit}: restart ({plan.restart})", logger.info)
        yield (
            f"systemctl daemon-reload && systemctl restart {q(plan.unit)} && "
            f"systemctl is-active --quiet {q(plan.unit)} && mkdir -p "
            f"{q(str(Path(plan.stamp_path).parent))} && echo {plan.stamp} > {q(plan.stamp_path)}"
        )
    if not (plan.enable or plan.restart):
        host.noop(f"{plan.unit} runs its planned environment and venv")


def configure(plan: GuestPlan) -> None:
    """Apply the guest plan: repository, toolkits, default, env, uv, venvs, services."""
    for path in (KEYRING, SOURCES):
        if path in plan.files:
            guest_file(name=f"CUDA repository: {path}", item=plan.files[path])
    if plan.toolkits:
        toolkits(name="CUDA toolkits", plan=plan, sources=SOURCES)
        cuda_default(name="Default CUDA toolkit (/usr/local/cuda)", plan=plan)
    for item in plan.files.values():
        if item.path not in (KEYRING, SOURCES) and not item.path.endswith(".service"):
            guest_file(name=f"Guest environment: {item.path}", item=item)
    if plan.venvs:
        uv_binary(name="uv", plan=plan)
    for v in plan.venvs:
        venv(name=f"venv {v.path}", plan=v, uv_env=plan.uv_env)
    for s in plan.services:
        guest_file(name=f"Service unit: {s.unit_path}", item=plan.files[s.unit_path])
        service(name=f"Service {s.unit}", plan=s)
