"""The guest software plan as the guest deploy prints it (secret-named values never shown)."""

from __future__ import annotations

from gpuhost.guestsw.model import GuestPlan


def render_guest_plan(plan: GuestPlan) -> str:
    out = [f"Guest software plan for {plan.guest} (host driver {plan.driver or 'not visible'}):"]
    for tk in plan.toolkits:
        state = "install" if tk.package in plan.install_toolkits else "installed"
        mark = "  (default: /usr/local/cuda)" if tk == plan.default else ""
        out.append(f"  CUDA {tk.version}: {tk.package} -> {tk.prefix} [{state}]{mark}")
    if plan.default and plan.set_default:
        out.append(f"  set /usr/local/cuda -> {plan.default.prefix} (update-alternatives)")
    out.append(f"  {plan.max_jobs_rule}")
    for name, value in sorted(plan.env.items()):
        out.append(f"  env {name}={value}")
    for v in plan.venvs:
        pins = ", ".join(f"{n}=={ver}" for n, ver in v.pins.items()) or "none"
        todo = "; ".join(
            x
            for x in (v.create and f"create ({v.create})", v.install and f"install ({v.install})")
            if x
        )
        out.append(f"  venv {v.path} python {v.python}, pins {pins}: {todo or 'converged'}")
    for s in plan.services:
        out.append(
            f"  service {s.unit} ({s.venv}): {f'restart ({s.restart})' if s.restart else 'running as planned'}"
        )
    out += [f"  note: {n}" for n in plan.notes]
    return "\n".join(out)
