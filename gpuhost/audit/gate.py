"""The trial boot's gate: the audit's host checks that prove a new kernel and driver came up.

A trial boot is committed (the new kernel pinned as the default) only when every one of these
passes on the booted host; a check that does not apply there (no VM with GPUs, say) does not
block. The checks are the audit's own, on a Plan made from what the new boot shows, so the gate
and `gpuhost audit` can never disagree about a host. Guests are not read: they are stopped
during a trial.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.audit.model import CHECKS
from gpuhost.audit.observe import Runner
from gpuhost.audit.run import HostAudit, evaluate, read_host
from gpuhost.spec.host import HostSpec

# Right kernel, command line and loader files; the planned driver, open flavour, built by the
# kernel's compiler, with matching GSP firmware; uvm_disable_hmm and the other parameters;
# every GPU on its planned driver; the device nodes the guests will need; the pools and
# Proxmox storages the guests start from (a kernel without zfs.ko or a disk driver boots, but
# imports no pool).
GATE = (
    "boot.kernel",
    "boot.cmdline",
    "boot.loader",
    "storage.zfs",
    "storage.pve",
    "gpus.inventory",
    "gpus.binding",
    "driver.version",
    "driver.compiler",
    "driver.firmware",
    "modules.parameters",
    "modules.loaded",
    "devices.nodes",
)
# The gate needs no peer copies: one small buffer proves CUDA is not part of it anyway.
GATE_SIZES = (4096,)


@dataclass(frozen=True)
class GateResult:
    passed: tuple[str, ...]
    failed: tuple[str, ...]  # one rendered finding per line, check id first
    not_applicable: tuple[str, ...]  # "check: reason"
    commands: int

    @property
    def ok(self) -> bool:
        return not self.failed


def judge(audit: HostAudit, skip: tuple[str, ...] = ()) -> GateResult:
    passed, failed, skipped = [], [], []
    for check_id in GATE:
        if check_id in skip:
            skipped.append(f"{check_id}: checked after the commit writes it")
            continue
        outcome = evaluate(audit, CHECKS[check_id], None)
        if outcome.status == "failed":
            failed += [f"{check_id}: {f.render()}" for f in outcome.findings]
        elif outcome.status == "skipped":
            skipped.append(f"{check_id}: {outcome.skipped}")
        else:
            passed.append(check_id)
    return GateResult(tuple(passed), tuple(failed), tuple(skipped), audit.commands)


def run_gate(
    name: str,
    spec: HostSpec,
    run: Runner,
    source: str | None = None,
    sizes: tuple[int, ...] = GATE_SIZES,
    skip: tuple[str, ...] = (),
) -> GateResult:
    """Read the host once (no guests) and judge it by the gate's checks (less ``skip``)."""
    return judge(read_host(name, spec, run, sizes=sizes, source=source, guests=False), skip)
