"""VMs' GPUs through Proxmox's API: PCI mappings, owned `hostpciN` entries, machine type.

Through the API token (proxmoxer, gpuhost/pve/api.py) wherever Proxmox lets a token act: the
cluster PCI mappings (Mapping.Modify on /mapping/pci) and `hostpciN: mapping=...` (VM.Config.HWType
on /vms/<vmid> plus Mapping.Use on the mapping). Through root on the host, over the deploy's own
SSH connection, only where Proxmox requires root@pam: taking over a hand-made `host=` entry.
Each VM's config is backed up on the host before the first change; each PUT carries the digest
of the config read just before it, checked against what the Plan saw, so a config that changed
under the run is not overwritten. A VM whose GPUs change is stopped before (deploys/split.py, or
the run's reboot) and started after, so its entries apply at that start.
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from pyinfra import host, logger
from pyinfra.api import OperationError, operation

from deploys.context import observed
from deploys.ops import step
from gpuhost.observe.proxmox import MAPPINGS_FILE, parse_pci_mappings
from gpuhost.plan.guests.mappings import refresh_command
from gpuhost.plan.guests.vms import MAPPING_PREFIX, PciMapping, VmGpus
from gpuhost.plan.make import Plan
from gpuhost.pve.backup import backup_command
from gpuhost.pve.token import ApiTokenError
from gpuhost.spec.inventory import SPEC_KEY

if TYPE_CHECKING:
    from gpuhost.pve.api import PveApi

CA_FILE = "/etc/pve/pve-root-ca.pem"

# One connection per host of a run. Keyed by the host's name, not id(host): the `host` every
# module imports is pyinfra's context proxy, one object for all hosts, so id(host) would hand
# the first host's API (its address and token) to every other host of the fleet.
_apis: dict[tuple[int, str], PveApi] = {}


def node_name() -> str | None:
    """The node as Proxmox names it: /etc/pve/local links to nodes/<node>."""
    managed = observed(host).managed
    link = managed.links.get("/etc/pve/local", "") if managed else ""
    return link.removeprefix("nodes/") or None


def api() -> PveApi:
    """The host's API connection, made once per run at execution (never at --dry)."""
    # The API client (requests, proxmoxer) is loaded by the first run that calls the API, not
    # by every run: a converged re-run never does.
    from gpuhost.pve import api as pveapi

    key = (id(host.state), host.name)
    if key not in _apis:
        spec = host.data.get(SPEC_KEY).proxmox
        managed = observed(host).managed
        ca = managed.files.get(CA_FILE) if managed else None
        address = host.data.get("ssh_hostname") or host.name
        try:
            _apis[key] = pveapi.connect(spec, address, ca)
        except (pveapi.PveApiError, ApiTokenError) as exc:
            raise OperationError(f"Proxmox API: {exc}") from None
    return _apis[key]


def _call(method: str, path: str, **params) -> object:
    from gpuhost.pve.api import PveApiError  # loaded by api() already

    try:
        return api().call(method, path, **params)
    except PveApiError as exc:
        raise OperationError(str(exc)) from None


@operation(is_idempotent=True)
def pci_mappings(plan: Plan):
    """
    Create, update or remove gpuhost's cluster PCI mappings (``gpuhost-*``) to match the Plan.

    + plan: the host's Plan; its ``vm_split.mappings`` are the mappings this node needs
    """
    node = node_name()
    managed = observed(host).managed
    live = parse_pci_mappings((managed.files.get(MAPPINGS_FILE) or "") if managed else "")
    wanted = plan.vm_split.mappings
    if wanted and node is None:
        raise OperationError("/etc/pve/local is not a link to nodes/<node>: is pve-cluster up?")
    changed = False
    for mid, mapping in sorted(wanted.items()):
        entry = mapping.map_entry(node or "")
        have = live.get(mid)
        others = [m for m in (have.maps if have else ()) if f"node={node}" not in m.split(",")]
        maps = sorted([*others, entry])
        if have is not None and sorted(have.maps) == maps:
            continue
        changed = True
        logger.info(f"{host.print_prefix}PCI mapping {mid}: {entry}")
        yield step(_put_mapping(mapping, maps, create=have is None))
    for mid in sorted(set(live) - set(wanted)):
        if mid.startswith(MAPPING_PREFIX) and any(
            f"node={node}" in m.split(",") for m in live[mid].maps
        ):
            changed = True
            yield step(_drop_mapping(mid, [m for m in live[mid].maps if f"node={node}" not in m]))
    if not changed:
        host.noop("the PCI mappings are as planned")


def refresh_commands(plan: Plan) -> list[str]:
    """Commands that bring this node's entry of each planned mapping to the IOMMU group of the
    kernel running when they run (gpuhost.plan.guests.mappings, which the boot unit runs too, before
    pve-guests.service): made before a reboot, run after it, before the deploy starts guests
    (deploys.guests.start_guests runs them first)."""
    if not plan.vm_split.mappings or node_name() is None:
        return []
    return [refresh_command(m) for _, m in sorted(plan.vm_split.mappings.items())]


@operation(is_idempotent=True)
def refresh_mappings(plan: Plan):
    """
    After this run's reboot: this node's PCI mapping entries get the IOMMU groups of the kernel
    now running (the groups can change at a reboot; Proxmox checks them at every VM start).

    + plan: the host's Plan; nothing to do when the run does not reboot
    """
    commands = refresh_commands(plan) if plan.rebooting else []
    if not commands:
        host.noop("no reboot in this run: the PCI mappings' IOMMU groups are the running kernel's")
        return
    yield from commands


def _put_mapping(mapping: PciMapping, maps: list[str], create: bool):
    def run(state, host) -> None:
        description = "gpuhost: a GPU board for a VM (managed; edits are overwritten)"
        if create:
            _call("post", "/cluster/mapping/pci", id=mapping.id, map=maps, description=description)
        else:
            _call("put", f"/cluster/mapping/pci/{mapping.id}", map=maps, description=description)

    return run


def _drop_mapping(mid: str, rest: list[str]):
    def run(state, host) -> None:
        if rest:  # other nodes of the cluster still use it
            _call("put", f"/cluster/mapping/pci/{mid}", map=rest)
        else:
            _call("delete", f"/cluster/mapping/pci/{mid}")

    return run


@operation(is_idempotent=True)
def vm_gpus(plan: Plan, vm: VmGpus):
    """
    Bring one VM's owned hostpci entries and machine type to the Plan.

    + plan: the host's Plan
    + vm: the VM's entries (from ``plan.vm_split``)
    """
    if not vm.exists:
        logger.warning(f"{host.print_prefix}vm {vm.vmid} does not exist; create it, then re-run")
        host.noop(f"vm {vm.vmid} does not exist")
        return
    if not vm.changes:
        host.noop(f"vm {vm.vmid} ({vm.name}) has its GPU entries")
        return
    path = f"/nodes/{node_name()}/qemu/{int(vm.vmid)}"
    yield backup_command("qemu", vm.vmid)
    for key, value in sorted(vm.adopt.items()):
        # A user's `host=` entry: only root@pam may change it (qm over SSH, as root).
        wanted = vm.hostpci[key]
        logger.info(f"{host.print_prefix}vm {vm.vmid}: {key}: {value} -> {wanted} (as root)")
        yield f"qm set {int(vm.vmid)} --{key} {shlex.quote(wanted)}"
    token_keys = {k: v for k, v in vm.hostpci.items() if k not in vm.adopt}
    if token_keys or vm.delete or vm.machine:
        yield step(_put_config(path, vm, token_keys))


def _put_config(path: str, vm: VmGpus, entries: dict[str, str]):
    def run(state, host) -> None:
        config = _call("get", f"{path}/config")
        assert isinstance(config, dict)
        # Only this run's owned entries may differ from what the Plan saw; anything else
        # is someone else's edit, and the digest makes Proxmox refuse a change after it.
        for key in entries:
            now = config.get(key)
            if now is not None and not str(now).startswith(f"mapping={MAPPING_PREFIX}"):
                raise OperationError(
                    f"vm {vm.vmid}: {key} is now {now!r}, not gpuhost's: the config changed "
                    "under this run; re-run to plan again"
                )
        params: dict[str, object] = {**entries, "digest": config["digest"]}
        if vm.delete:
            params["delete"] = ",".join(vm.delete)
        if vm.machine:
            params["machine"] = vm.machine
        _call("put", f"{path}/config", **params)

    return run


def configure(plan: Plan) -> None:
    """Apply the Plan's VM side: mappings first (a hostpci entry names one), then each VM.
    (The boot unit that refreshes their IOMMU groups is deploys/devices.py's.)"""
    if not plan.vm_split.vms and not plan.vm_split.mappings:
        return
    pci_mappings(name="PCI mappings for the VMs' GPUs", plan=plan)
    for vmid, vm in sorted(plan.vm_split.vms.items()):
        vm_gpus(name=f"GPU entries of vm {vmid}", plan=plan, vm=vm)
