"""A host's audit (its checks, what it read) and its GPUs' telemetry -> metric samples."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuhost.audit.model import Outcome
from gpuhost.audit.observe import Runner
from gpuhost.audit.run import HostAudit, audit_all, read_host
from gpuhost.metrics import families as m
from gpuhost.metrics.render import Sample, sample
from gpuhost.observe.cuda import DEFAULT_SIZES
from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.telemetry import NvidiaTelemetry, Telemetry
from gpuhost.plan.guests.devices import node_minor
from gpuhost.spec.guests import LxcGuest
from gpuhost.spec.host import HostSpec
from gpuhost.spec.specfile import ENV_CHECKS

GPU_NODE = re.compile(r"^/dev/nvidia\d+$")
STATUS = {"passed": "passed", "failed": "failed", "skipped": "not_applicable"}


@dataclass
class Measured:
    """One host measured: the audit, its outcomes, the telemetry and when it finished."""

    audit: HostAudit
    outcomes: list[Outcome]
    telemetry: Telemetry
    seconds: float
    finished: float  # unix time


def read_telemetry(run: Runner) -> Telemetry:
    """The GPUs' telemetry; output it cannot read is reported (telemetry_up 0), and the audit's
    metrics are written all the same."""
    probe = NvidiaTelemetry()
    _, stdout, _ = run(probe.command())
    try:
        return probe.process(stdout.splitlines())
    except UnparsedOutput as exc:
        return Telemetry(error=str(exc))


def measure(
    name: str,
    spec: HostSpec,
    run: Runner,
    guest_runner: Callable[[LxcGuest], Runner] | None = None,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    source: str | None = None,
    redacted: set[str] | frozenset[str] = frozenset(),
    clock: Callable[[], float] | None = None,
    wall: Callable[[], float] | None = None,
) -> Measured:
    """Audit ``name`` (one command for the host, one per GPU container) and read its telemetry
    (one more command). ``redacted``: guests whose env checks cannot be judged (spec file)."""
    clock, wall = clock or time.monotonic, wall or time.time
    started = clock()
    audit = read_host(name, spec, run, guest_runner, sizes, source)
    outcomes = audit_all(audit)
    for outcome in outcomes:
        guest = outcome.target.partition("/")[2]
        if guest in redacted and outcome.check.id in ENV_CHECKS:
            outcome.findings, outcome.details = [], {}
            outcome.skipped = (
                "the spec file holds this guest's secret-named environment values redacted; "
                "`gpuhost audit` from the control machine checks them"
            )
    telemetry = read_telemetry(run)
    return Measured(audit, outcomes, telemetry, clock() - started, wall())


def _check_samples(host: str, outcomes: list[Outcome]) -> list[Sample]:
    out = []
    counts = dict.fromkeys(STATUS.values(), 0)
    for o in outcomes:
        labels = {"host": host, "guest": o.target.partition("/")[2], "check": o.check.id}
        applicable = o.status != "skipped"
        counts[STATUS[o.status]] += 1
        out.append(sample(m.CHECK_APPLICABLE, int(applicable), **labels))
        if applicable:
            out.append(sample(m.CHECK_OK, int(o.status == "passed"), **labels))
            out.append(sample(m.CHECK_FINDINGS, len(o.findings), **labels))
    out += [sample(m.CHECKS, n, host=host, status=s) for s, n in counts.items()]
    return out


def _owners(measured: Measured) -> dict[str, str]:
    """GPU BDF -> the name of the guest the Plan gives it to."""
    ctx = measured.audit.context
    if ctx is None:
        return {}
    names = {(g.kind, g.guest_id): g.name for g in ctx.spec.guests}
    return {a.bdf: names.get((a.owner.kind, a.owner.id), "") for a in ctx.plan.gpus}


def _version_samples(host: str, measured: Measured) -> list[Sample]:
    ctx = measured.audit.context
    if ctx is None:
        return []
    facts = ctx.host.facts
    firmware = sorted(
        {i["GPU Firmware"] for i in facts.gpu_information.values() if i.get("GPU Firmware")}
    )
    out = [
        sample(
            m.DRIVER_INFO,
            1,
            host=host,
            driver=ctx.spec.driver.version,
            module=ctx.driver_version or "",
            userspace=",".join(ctx.host.userspace.get("libcuda", [])),
            gsp_firmware=",".join(firmware),
        )
    ]
    uvm = facts.char_devices.get("nvidia-uvm")
    if uvm is not None:
        out.append(sample(m.UVM_MAJOR, uvm, host=host))
    return out


def _guest_samples(host: str, measured: Measured) -> list[Sample]:
    ctx = measured.audit.context
    if ctx is None:
        return []
    out = []
    for guest in ctx.spec.guests:
        planned = [
            a for a in ctx.plan.gpus if a.owner.kind == guest.kind and a.owner.id == guest.guest_id
        ]
        if not planned:
            continue
        labels = {"host": host, "guest": guest.name}
        out.append(sample(m.GUEST_GPUS_PLANNED, len(planned), **labels))
        if not isinstance(guest, LxcGuest) or guest.ctid not in ctx.guests:
            continue
        view = ctx.guests[guest.ctid]
        out.append(sample(m.GUEST_UP, int(view.unreachable is None), **labels))
        if view.unreachable is not None:
            continue
        libcuda = ",".join(view.userspace.get("libcuda", []))
        out.append(sample(m.GUEST_USERSPACE, 1, **labels, userspace=libcuda))
        present = 0
        for path in ctx.plan.lxc_nodes.get(guest.ctid, ()):
            node = view.nodes.get(path)
            if GPU_NODE.match(path) and node is not None:
                present += (node.major, node.minor) == (ctx.live_major(path), node_minor(path))
        out.append(sample(m.GUEST_GPU_NODES, present, **labels))
        if view.cuda is not None:
            seen = len(view.cuda.devices) if view.cuda.init == "CUDA_SUCCESS" else 0
            out.append(sample(m.GUEST_CUDA_DEVICES, seen, **labels))
    return out


def _gpu_samples(host: str, measured: Measured) -> list[Sample]:
    telemetry = measured.telemetry
    out = [sample(m.TELEMETRY_UP, int(telemetry.error is None), host=host)]
    owners = _owners(measured)
    for gpu in telemetry.gpus:
        out.append(
            sample(
                m.GPU_INFO,
                1,
                host=host,
                gpu=gpu.bdf,
                index=gpu.text.get("index", ""),
                uuid=gpu.text.get("uuid", ""),
                name=gpu.text.get("name", ""),
                vbios=gpu.text.get("vbios_version", ""),
                guest=owners.get(gpu.bdf, ""),
            )
        )
        for field, value in gpu.values.items():
            family, extra, scale = m.TELEMETRY[field]
            out.append(sample(family, value * scale, host=host, gpu=gpu.bdf, **extra))
    return out


def samples(host: str, measured: Measured) -> list[Sample]:
    """Every sample of one measured host."""
    out = _check_samples(host, measured.outcomes)
    out += [
        sample(m.AUDIT_DURATION, round(measured.seconds, 3), host=host),
        sample(m.AUDIT_TIMESTAMP, round(measured.finished, 3), host=host),
        sample(m.PLAN_OK, int(measured.audit.refused is None), host=host),
    ]
    out += _version_samples(host, measured)
    out += _guest_samples(host, measured)
    out += _gpu_samples(host, measured)
    return out
