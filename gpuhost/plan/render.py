"""Plain-text rendering of a plan, for terminals and logs."""

from __future__ import annotations

from gpuhost.plan.make import Plan
from gpuhost.redact import is_secret_name


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [line.rstrip(), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(out)


def _opt(value: object) -> str:
    return "-" if value is None else str(value)


def _p2p(ok: bool | None) -> str:
    return "not checked" if ok is None else "OK" if ok else "not supported"


def render_plan(plan: Plan) -> str:
    rows = [
        [
            str(g.index),
            g.bdf,
            g.model,
            _opt(g.numa_node),
            _opt(g.iommu_group),
            f"{g.driver_now or 'none'} -> {g.driver_planned}",
            str(g.owner),
        ]
        for g in plan.gpus
    ]
    out = [f"GPU plan for {plan.host}", ""]
    out.append(
        table(["idx", "BDF", "model", "NUMA", "IOMMU", "driver now -> planned", "owner"], rows)
    )
    out += ["", f"boot loader: {plan.loader}"]
    changes = [f"+{p}" for p in plan.cmdline_add] + [f"-{p}" for p in plan.cmdline_remove]
    out.append(f"kernel command line: {' '.join(changes) if changes else 'no change'}")
    out.append(f"  gpuhost's parameters: {' '.join(plan.cmdline_owned) or 'none'}")
    out.append(f"  after boot: {' '.join(plan.cmdline)}")
    for module, options in plan.module_options.items():
        out.append(f"options {module} {' '.join(f'{k}={v}' for k, v in options.items())}")
    if plan.blacklist:
        out.append(f"blacklist: {', '.join(plan.blacklist)}")
    if plan.modules_load:
        out.append(f"load at boot: {', '.join(m for ms in plan.modules_load.values() for m in ms)}")
    for owner in dict.fromkeys(g.owner for g in plan.gpus):
        pairs = {k: v for k, v in plan.p2p.items() if plan.owner_of(k[0]) == owner}
        values = set(pairs.values())
        if len(values) == 1:
            out.append(f"P2P within {owner}: {_p2p(values.pop())} for all {len(pairs)} pair(s)")
        elif pairs:
            out.append(f"P2P within {owner}:")
            out += [f"  {a} <-> {b}: {_p2p(ok)}" for (a, b), ok in sorted(pairs.items())]
    for g in plan.gpus:
        if g.owner.kind == "vm" and g.functions:
            out.append(f"{g.owner} takes the whole board {g.bdf} with {', '.join(g.functions)}")
    for owner, env in plan.guest_env.items():
        if env:
            shown = (f"{k}={'***' if is_secret_name(k) else v}" for k, v in sorted(env.items()))
            out.append(f"env for {owner}: {' '.join(shown)}")
    out += [ct.summary for ct in plan.containers.values()]
    if plan.monitoring is not None:
        mon = plan.monitoring
        exporter = "Debian's node_exporter" if mon.node_exporter else "no node_exporter"
        out.append(
            f"monitoring: gpuhost-metrics.timer every {mon.interval} s -> {mon.out} "
            f"(runtime for python {mon.python or '? (no python3)'}), {exporter}"
        )
    for (kind, vmid), hook in sorted(plan.readiness.hooks.items()):
        change = f"{hook.current or 'none'} -> " if hook.changes else ""
        out.append(f"{'CT' if kind == 'lxc' else 'VM'} {vmid}: hookscript {change}"
                   f"{hook.wanted or 'none'}")  # fmt: skip
    out += [f"held back at start in this boot, started after the fixes: {kind} {vmid}"
            for kind, vmid in sorted(plan.readiness.held)]  # fmt: skip
    out += ["", "managed files:"]
    for item in plan.files.values():
        state = f"-> {item.link}" if item.link else "present" if item.present else "absent"
        out.append(f"  {item.path}: {state}")
    out.append("")
    if plan.reboot_now:
        out.append("this run reboots the host, because:")
        out += [f"  - {r}" for r in plan.reboot_now]
        if plan.pin_running_kernel:
            out.append(f"  (kernel {plan.running_kernel} is pinned first)")
    else:
        out.append("no reboot needed")
    if plan.trial_boot is not None:
        out.append(f"trial boot ({plan.trial_step.value}): {plan.trial_boot.summary}")
    binding = [r for r in plan.reboot_later if r.concern == "binding"]
    later = [r for r in plan.reboot_later if r.concern != "binding"]
    if binding:
        out.append(
            "GPU binding: this run moves the boards live where the IOMMU is on (their guests "
            "stopped first), else the vfio-pci claim binds them at the next boot:"
        )
        out += [f"  - {r}" for r in binding]
    if later:
        out.append("needs a later deploy (not applied by this one yet), then a reboot:")
        out += [f"  - {r}" for r in later]
    if plan.preconditions:
        out.append("preconditions (checked before the first change):")
        out += [f"  {p.line()}" for p in plan.preconditions]
    else:
        out.append("preconditions: none (nothing needed from the control machine)")
    if plan.notes:
        out.append("notes:")
        out += [f"  - {n}" for n in plan.notes]
    return "\n".join(out)
