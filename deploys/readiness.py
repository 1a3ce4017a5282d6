"""GPU guests' readiness check at start: gpuhost's Proxmox hookscript on every GPU guest.

From the Plan (gpuhost/plan/guests/readiness.py): the `local` storage gets `snippets` content
if it lacks it (`pvesm set`); the hookscript (files/gpuhost-ready) goes to its snippets
directory and each GPU guest's contract to /etc/gpuhost/ready/<vmid>.json; then each guest's
`hookscript` is set with `pct set` / `qm set` as root over the deploy's SSH connection (only
root@pam may change a hookscript: pve-container PVE/LXC.pm, qemu-server API2/Qemu.pm), after
the files, since Proxmox checks that the script exists and is executable when it is set
(pve-guest-common GuestHelpers.pm check_hookscript). A guest that keeps its own hookscript has
it recorded in its contract and run by gpuhost's; a guest without GPUs any more gets it back,
before its contract (which recorded it) is removed. Each guest config is backed up first.
A GPU guest the check held back in this boot (its mark, /var/lib/gpuhost/held-<vmid>) is
started at the end of the run, after the fixes (a raw rule rewritten at the new major).
"""

from __future__ import annotations

import shlex

from pyinfra import host, logger
from pyinfra.api import deploy, operation

from deploys.ops import as_planned, files_as_planned, managed_file
from gpuhost.plan.guests.readiness import CONCERN, SNIPPETS_STORAGE, GuestHook
from gpuhost.plan.make import Plan
from gpuhost.pve.backup import backup_command

LABEL = "Readiness check"


@operation()
def snippets_content(content: str):
    """
    Give the `local` storage `snippets` content, where gpuhost's hookscript lives.

    + content: the storage's whole content list as it must be
    """
    host.log(f"storage {SNIPPETS_STORAGE}: content {content}", logger.info)
    yield f"pvesm set {SNIPPETS_STORAGE} --content {shlex.quote(content)}"


@operation()
def guest_hookscript(hook: GuestHook):
    """
    Set a guest's `hookscript` to the Plan's (gpuhost's, or the guest's own given back).

    + hook: the Plan's entry for the guest
    """
    word = "CT" if hook.kind == "lxc" else "VM"
    if not hook.changes:
        host.noop(f"{word} {hook.vmid}: hookscript {hook.wanted or 'none'}")
        return
    change = f"--hookscript {shlex.quote(hook.wanted)}" if hook.wanted else "--delete hookscript"
    host.log(f"{word} {hook.vmid}: hookscript {hook.current or 'none'} -> "
             f"{hook.wanted or 'none'}", logger.info)  # fmt: skip
    yield f"{backup_command(hook.kind, hook.vmid)} && {hook.tool} set {hook.vmid} {change}"


@operation()
def start_held(kind: str, vmid: int, line: str):
    """
    Start a GPU guest whose start gpuhost's check refused in this boot, now that the run has
    applied its fixes: the check runs again, and a refusal fails this operation with its line.

    + kind: "lxc" | "qemu"
    + vmid: the guest
    + line: what the check said then
    """
    host.log(f"{'CT' if kind == 'lxc' else 'VM'} {vmid} was held back ({line}): starting it",
             logger.info)  # fmt: skip
    yield f"{'pct' if kind == 'lxc' else 'qm'} start {int(vmid)}"


def _files(plan: Plan, present: bool) -> None:
    items = [f for f in plan.files.values() if f.concern == CONCERN and f.present == present]
    settled = [item.path for item in items if as_planned(item)]
    if settled:
        files_as_planned(name=f"{LABEL}: {len(settled)} file(s) as planned", paths=settled)
    for item in items:
        if item.path not in settled:
            managed_file(name=f"{LABEL}: {item.path}", item=item)


@deploy("GPU guests' readiness check")
def configure(plan: Plan) -> None:
    readiness = plan.readiness
    items = [f for f in plan.files.values() if f.concern == CONCERN]
    hooks = sorted(readiness.hooks.items())
    if not items and not hooks:
        return
    if (
        readiness.snippets_content is None
        and not any(hook.changes for _, hook in hooks)
        and all(as_planned(item) for item in items)
    ):  # what the operations below would each find: one operation that changes nothing
        name = f"{LABEL}: {len(items)} file(s), {len(hooks)} guest hookscript(s) as planned"
        files_as_planned(name=name, paths=[item.path for item in items])
        return
    if readiness.snippets_content is not None:
        snippets_content(
            name=f"{LABEL}: storage {SNIPPETS_STORAGE} holds snippets",
            content=readiness.snippets_content,
        )
    _files(plan, present=True)  # the script and the contracts before any guest names them
    for (kind, vmid), hook in sorted(readiness.hooks.items()):
        word = "CT" if kind == "lxc" else "VM"
        guest_hookscript(name=f"{LABEL}: {word} {vmid}'s hookscript", hook=hook)
    _files(plan, present=False)  # then what no guest names any more


@deploy("GPU guests held back at start")
def start_held_guests(plan: Plan) -> None:
    """After the run's fixes (raw rules at the new majors, nodes, binding): start the GPU guests
    the check held back in this boot. Not in a run that reboots: the boot starts them."""
    if plan.rebooting:
        return
    for (kind, vmid), line in sorted(plan.readiness.held.items()):
        word = "CT" if kind == "lxc" else "VM"
        start_held(name=f"{word} {vmid}: start it (held back at its start)", kind=kind,
                   vmid=vmid, line=line)  # fmt: skip
