"""GPU containers: exactly their GPUs' device entries, and the host driver's userspace inside.

Device entries come from the Plan (gpuhost/plan/guests/containers.py), applied as root over the deploy's own SSH
connection: devN with `pct set <ctid> --digest <sha1> --devN ... --delete ...` (only root@pam
may set devN; an API token gets 403), raw lxc.* lines by rewriting the config file under
Proxmox's own config lock (/run/lock/lxc/pve-config-<ctid>.lock), only when its SHA-1 is still
the digest read at the start of the run, touching only gpuhost's lines. The config is backed
up first (gpuhost/pve/backup.py). What gpuhost owns is recorded in
/var/lib/gpuhost/ct-<ctid>-devices: before a change as the union of the old and the new
entries, afterwards as the new ones, so a run killed in between still knows its lines.

A running container gets changed entries only at its next start (devN wait in [pve:pending];
raw lines are read by LXC at start), so it is restarted: Proxmox's stopall for that one
container (clean shutdown, hard stop after the timeout, as around gpuhost's reboots), then
`pct start`, which applies the pending entries. A mark (/var/lib/gpuhost/ct-<ctid>-restart)
written before the change and removed after the start makes a killed run restart it next time.

The userspace: NVIDIA's `.run` of driver.version, pushed into each running GPU container with
`pct push` and run there with the host's no-kernel-modules flags, one container at a time in
Proxmox's startup order, when the host runs that driver (or reboots into it in this run), then
checked against the host's /proc/driver/nvidia/version.
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, OperationError, deploy, operation

from deploys.context import observed
from deploys.ops import write_file
from facts.containers import ContainerStates
from gpuhost.observe.containers import ContainerState
from gpuhost.observe.nvidia_driver import NvidiaUserspace
from gpuhost.paths import STATE_DIR
from gpuhost.plan.driver.userspace import INSTALLER_FLAGS, DriverUserspace
from gpuhost.plan.guests.containers import ContainerDevices, edit_raw, record_path, restart_marker
from gpuhost.plan.guests.power import guests_from_configs, start_order
from gpuhost.plan.make import Plan
from gpuhost.pve.backup import backup_command, config_path

GUEST_DIR = STATE_DIR  # inside the container too: where the installer is pushed
STOP_TIMEOUT = 180  # seconds a container gets to shut down before it is stopped hard
_q = shlex.quote


def _states(ctids: tuple[int, ...]) -> dict[int, ContainerState]:
    return host.get_fact(ContainerStates, ctids=tuple(sorted(ctids))) if ctids else {}


def raw_edit_command(ctid: int, digest: str, new_text: str) -> str:
    """Rewrite the config under Proxmox's config lock, only if it is still what was read."""
    conf = config_path("lxc", ctid)
    tmp = f"{conf}.tmp.gpuhost"
    script = (
        f'[ "$(sha1sum < {conf} | cut -d" " -f1)" = {digest} ] || '
        f"{{ echo 'gpuhost: {conf} changed since this run read it (digest {digest}); "
        "nothing written: run the deploy again' >&2; exit 1; } && "
        f"printf %s {_q(new_text)} > {tmp} && mv -f {tmp} {conf}"
    )
    return (
        f"mkdir -p /run/lock/lxc && flock /run/lock/lxc/pve-config-{ctid}.lock sh -c {_q(script)}"
    )


def restart_command(ctid: int, timeout: int = STOP_TIMEOUT) -> str:
    status = f"pct status {ctid}"
    return (
        f"pvesh create /nodes/localhost/stopall --vms {ctid} --timeout {int(timeout)} && "
        f"{{ {status} | grep -qx 'status: stopped' || {{ echo 'CT {ctid} still runs after "
        "its shutdown' >&2; exit 1; }; } && "
        f"pct start {ctid} && {status} | grep -qx 'status: running' && "
        f"rm -f {_q(restart_marker(ctid))}"
    )


@operation()
def container_devices(ct: ContainerDevices):
    """
    Give container ``ct.ctid`` exactly the Plan's device entries (devN or raw lines), leaving
    every entry gpuhost does not own alone; restart it when it runs with other ones.

    + ct: the Plan's entry for the container (gpuhost/plan/guests/containers.py)
    """
    files = observed(host).files or {}
    record = record_path(ct.ctid)
    if not ct.changes_config and not ct.restart:
        if files.get(record) != (ct.record or None):
            yield write_file(record, ct.record) if ct.record else f"rm -f {_q(record)}"
        else:
            host.noop(f"CT {ct.ctid} grants {len(ct.nodes)} NVIDIA node(s) ({ct.mode})")
        return
    ctid = ct.ctid
    if ct.changes_config:
        state = _states((ctid,)).get(ctid)
        if state is None or state.text is None or state.digest is None:
            raise OperationError(f"{config_path('lxc', ctid)} is gone")
        old = [ln for ln in (files.get(record) or "").splitlines() if ln]
        union = "".join(f"{ln}\n" for ln in dict.fromkeys([*old, *ct.record.splitlines()]))
        first = [backup_command("lxc", ctid), write_file(record, union)]
        if ct.running:
            first.append(f"touch {_q(restart_marker(ctid))}")
        yield " && ".join(first)
        digest = state.digest
        if ct.raw_add or ct.raw_remove:
            text = edit_raw(state.text, ct.raw_remove, ct.raw_add)
            for line in ct.raw_remove:
                host.log(f"CT {ctid}: - {line}", logger.info)
            for line in ct.raw_add:
                host.log(f"CT {ctid}: + {line}", logger.info)
            yield raw_edit_command(ctid, digest, text)
            digest = hashlib.sha1(text.encode()).hexdigest()
        if ct.dev_set or ct.dev_delete:
            words = [f"pct set {ctid} --digest {digest}"]
            words += [f"--{key} {_q(value)}" for key, value in ct.dev_set.items()]
            if ct.dev_delete:
                words.append(f"--delete {','.join(ct.dev_delete)}")
            host.log(f"CT {ctid}: {' '.join(words)}", logger.info)
            yield " ".join(words)
        yield write_file(record, ct.record) if ct.record else f"rm -f {_q(record)}"
    if ct.restart:
        host.log(f"CT {ctid} restarts to get its device entries", logger.info)
        yield restart_command(ctid)


def _loaded_version() -> str:
    """Shell printing the loaded nvidia module's version (/proc/driver/nvidia/version)."""
    return (
        "awk '/^NVRM version:/ { for (i = 1; i <= NF; i++) "
        "if ($i ~ /^[0-9]+[.][0-9]+([.][0-9]+)?$/) { print $i; exit } }' "
        "/proc/driver/nvidia/version 2>/dev/null"
    )


def _verify(ctid: int, version: str) -> str:
    libs = NvidiaUserspace().command()
    return (
        f"loaded=$({_loaded_version()}) && "
        f"found=$(pct exec {ctid} -- sh -c {_q(libs)} | sed -n "
        "'s#^/.*/\\(lib[a-z-]*\\)\\.so\\.\\([0-9.]*\\)$#\\1 \\2#p' | sort -u | tr '\\n' ' ') && "
        f'want="libcuda {version} libnvidia-ml {version} " && '
        f'if [ "$found" != "$want" ] || [ "$loaded" != {_q(version)} ]; then echo "gpuhost: '
        f"CT {ctid} shows userspace '${{found% }}' with the host driver '$loaded' loaded; "
        f'wanted {version} in both" >&2; exit 1; fi'
    )


@operation()
def container_userspace(wanted: DriverUserspace, ctids: tuple[int, ...], ready: bool):
    """
    Install the userspace of ``wanted.version`` (no kernel modules) into each running GPU
    container that shows another one, one at a time in ``ctids`` order, then verify it.

    + wanted: the Plan's host userspace (version and the installer on the control machine)
    + ctids: the GPU containers, in the order to bring them along
    + ready: the host runs ``wanted.version`` (or reboots into it before this runs)
    """
    states = _states(ctids)
    files = observed(host).files or {}
    version = wanted.version
    due = []
    for ctid in ctids:
        state = states.get(ctid, ContainerState(ctid))
        pending = f"{STATE_DIR}/ct-{ctid}-pending-userspace"
        if state.status != "running":
            logger.warning(
                f"{host.print_prefix}CT {ctid} is {state.status or 'missing'}: its NVIDIA "
                "userspace is installed by a run while it runs (gpuhost does not start it)"
            )
        elif state.userspace == {"libcuda": [version], "libnvidia-ml": [version]} and (
            pending not in files
        ):
            continue
        else:
            due.append((ctid, pending, state.userspace))
    if not due:
        host.noop(f"GPU containers have the NVIDIA {version} userspace")
        return
    if not ready:
        waiting = (
            f"CT {', '.join(str(c) for c, _, _ in due)}: the {version} userspace follows the "
            f"boot that loads driver {version} (the host runs another one now)"
        )
        host.log(waiting, logger.info)
        host.noop(waiting)
        return
    name = posixpath.basename(wanted.installer)
    remote = wanted.remote_installer
    yield f"mkdir -p {_q(posixpath.dirname(remote))}"
    yield FileUploadCommand(wanted.installer, remote)
    inside = f"{GUEST_DIR}/{name}"
    for ctid, pending, now in due:
        found = ", ".join(f"{k} {'/'.join(v)}" for k, v in sorted(now.items())) or "none"
        host.log(f"CT {ctid}: NVIDIA userspace {found} -> {version}", logger.info)
        yield (
            f"touch {_q(pending)} && pct exec {ctid} -- mkdir -p {GUEST_DIR} && "
            f"pct push {ctid} {_q(remote)} {_q(inside)} --perms 0700 && "
            f"pct exec {ctid} -- sh {_q(inside)} {INSTALLER_FLAGS} && "
            f"pct exec {ctid} -- rm -f {_q(inside)} && {_verify(ctid, version)} && "
            f"rm -f {_q(pending)}"
        )
    yield f"rm -f {_q(remote)}"


def userspace_order(plan: Plan) -> tuple[int, ...]:
    """GPU containers in Proxmox's startup order (ascending `order`, then ctid): the ones
    that come up first at boot, which others may depend on, get the new userspace first."""
    configs = observed(host).guest_configs
    guests = guests_from_configs(configs)
    ordered = start_order(g for g in guests.values() if g.kind == "lxc")
    known = [g.vmid for g in ordered if g.vmid in plan.lxc_nodes]
    return tuple(known + sorted(c for c in plan.lxc_nodes if c not in known))


@deploy("GPU containers")
def configure(plan: Plan) -> None:
    for ct in plan.containers.values():
        container_devices(
            name=f"CT {ct.ctid}: {len(ct.nodes)} NVIDIA device node(s) as {ct.mode} entries",
            ct=ct,
        )
    wanted = plan.driver_userspace
    if wanted is None or not plan.lxc_nodes:
        return  # the userspace is not gpuhost's to manage here (no driver.source.installer)
    driver = observed(host).driver
    ready = (driver is not None and driver.version == wanted.version) or plan.rebooting
    container_userspace(
        name=f"NVIDIA {wanted.version} userspace in the GPU containers (no kernel modules)",
        wanted=wanted,
        ctids=userspace_order(plan),
        ready=ready,
    )
