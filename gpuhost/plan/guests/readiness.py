"""Each GPU guest's readiness check at start: gpuhost's hookscript and the guest's contract.

Proxmox runs a guest's `hookscript` (a volume `<storage>:snippets/<name>`) as `<path> <vmid>
<phase>` and aborts the start when `pre-start` exits non-zero: pve-guest-common
PVE/GuestHelpers.pm exec_hookscript, called with stop-on-error by pve-container PVE/LXC.pm
vm_start and qemu-server PVE/QemuServer.pm vm_start, for `pct start`, `qm start`, the API and
pve-manager's startall (Nodes.pm) alike. check_hookscript resolves the volume through
/etc/pve/storage.cfg (PVE::Storage::path; a dir storage's `<path>/snippets/<name>`).

gpuhost's hookscript (files/gpuhost-ready) lives in the `local` dir storage (/var/lib/vz, as
pve-installer creates it): its `snippets` content is added when missing (`pvesm set`), since
the web UI and Proxmox's docs expect hookscripts on a storage with that content. Each GPU guest
gets a contract, /etc/gpuhost/ready/<vmid>.json: exactly its part of the Plan, which the script
checks reading the host only. A guest with a hookscript of its own keeps it: the contract
records it (`chain`) and gpuhost's script runs it for every phase; a guest that loses its GPUs
(or `readiness.enabled: false`) gets it back. Guests without GPUs are never touched.

What the contract asks, and why:
- nodes: every device node the container is granted, a character device at the live major of
  its driver (/proc/devices) and its minor; with raw rules also the major the rules name (a
  reboot moves nvidia-uvm's: the rules go stale).
- driver: the loaded module's version, which the guest's userspace must equal. It is the
  spec's driver.version, set once the host runs it (now, or after this run's boot into the
  modules it installs): the container's own libraries cannot be read before pre-start
  (pve-container mounts its rootfs after the hookscript), and when the driver changes without
  a boot of gpuhost's, gpuhost brings the userspace along after it (deploys/containers.py).
- gpus and gsp: each of the container's GPUs on the nvidia driver, with the open module its GSP
  firmware at the loaded version (the audit's driver.firmware rule, per guest).
- persistenced, fabricmanager: the daemons the Plan runs (driver.source.installer; NVSwitches).
- vfio, mappings: a VM's functions on vfio-pci; each PCI mapping its entries use present for
  its board, and the board still the device the mapping names (vendor:device, IOMMU group), as
  Proxmox checks at start (pve-guest-common PVE/Mapping/PCI.pm).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.paths import HOOKSCRIPT, HOOKSCRIPT_VOLID, READY_DIR, STATE_DIR
from gpuhost.plan.driver.modconf import static_file
from gpuhost.plan.guests.containers import ContainerDevices
from gpuhost.plan.guests.devices import node_major, node_minor
from gpuhost.plan.guests.vms import VmSplit
from gpuhost.plan.model import GpuAssignment, ManagedFile
from gpuhost.spec.host import HostSpec

STORAGE_CFG = "/etc/pve/storage.cfg"
SNIPPETS_STORAGE = HOOKSCRIPT_VOLID.split(":", 1)[0]  # local
DEVICES_UNIT = "gpuhost-nvidia-devices.service"  # the boot unit that makes the nodes
CONCERN = "readiness"
_READY_FILE = re.compile(re.escape(READY_DIR) + r"/(\d+)\.json")
# The hookscript's mark of a start it refused: `<boot id> <its line>` (files/gpuhost-ready).
_MAPPING = re.compile(r"(?:^|,)mapping=([^,]+)")
_HELD = re.compile(re.escape(STATE_DIR) + r"/held-(\d+)")


def ready_path(vmid: int) -> str:
    return f"{READY_DIR}/{int(vmid)}.json"


@dataclass(frozen=True)
class GuestHook:
    """One guest's hookscript entry: what it must be, and the change to get there."""

    kind: str  # "lxc" | "qemu"
    vmid: int
    wanted: str | None  # the hookscript the config must name (None: none)
    current: str | None  # what it names now

    @property
    def changes(self) -> bool:
        return self.wanted != self.current

    @property
    def tool(self) -> str:
        return "pct" if self.kind == "lxc" else "qm"


@dataclass
class Readiness:
    """The Plan's readiness part: guests' hookscripts, the storage's content, the files."""

    hooks: dict[tuple[str, int], GuestHook] = field(default_factory=dict)
    contracts: dict[tuple[str, int], dict[str, object]] = field(default_factory=dict)
    snippets_content: str | None = None  # `local`'s content list to set (None: as it is)
    files: dict[str, ManagedFile] = field(default_factory=dict)
    # Guests whose start the check refused in this boot and that are still stopped: the run
    # starts them once it applied its fixes (the check runs again then). vmid -> its line.
    held: dict[tuple[str, int], str] = field(default_factory=dict)


def storages(text: str | None) -> dict[str, dict[str, str]]:
    """/etc/pve/storage.cfg: storage id -> {"type": ..., key: value} (pve-storage's
    section config: `type: id`, then indented `key value` lines)."""
    found: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in (text or "").splitlines():
        head = re.fullmatch(r"([a-z][a-z0-9]*):\s*(\S+)\s*", line)
        if head:
            current = found.setdefault(head[2], {"type": head[1]})
        elif line.strip() and current is not None and line[:1].isspace():
            key, _, value = line.strip().partition(" ")
            current[key] = value.strip()
    return found


def snippet_path(volid: str, cfg: dict[str, dict[str, str]]) -> str | None:
    """A `<storage>:snippets/<name>` volume's path (dir storages; network ones mount at
    /mnt/pve/<id>), as check_hookscript resolves it; None when it is no snippet."""
    storeid, _, volname = volid.partition(":")
    m = re.fullmatch(r"snippets/([^/]+)", volname)
    scfg = cfg.get(storeid)
    if m is None or scfg is None:
        return None
    return f"{(scfg.get('path') or f'/mnt/pve/{storeid}').rstrip('/')}/snippets/{m[1]}"


def _recorded_chain(files: dict[str, str], vmid: int) -> dict[str, str] | None:
    try:
        chain = json.loads(files.get(ready_path(vmid)) or "{}").get("chain")
    except (ValueError, AttributeError):
        return None
    return chain if isinstance(chain, dict) and chain.get("volid") else None


def _node_device(node: str) -> str:
    name = node.removeprefix("/dev/")
    if name.startswith("nvidia-uvm"):
        return "nvidia-uvm"
    return "nvidia-caps" if name.startswith("nvidia-caps/") else "nvidia"


def _contract(
    kind: str,
    vmid: int,
    label: str,
    spec: HostSpec,
    facts: HostFacts,
    ctx: dict[str, object],
) -> dict[str, object]:
    """The guest's part of the Plan, as the hookscript reads it."""
    converged = bool(ctx.get("driver_runs"))
    body: dict[str, object] = {
        "version": 1,
        "guest": label,
        "kind": kind,
        "vmid": vmid,
        "wait_s": spec.readiness.wait,
        "unit": DEVICES_UNIT,
    }
    if kind == "lxc":
        nodes: tuple[str, ...] = ctx["nodes"]  # type: ignore[assignment]
        ct: ContainerDevices | None = ctx["ct"]  # type: ignore[assignment]
        raw = ct is not None and ct.mode == "raw" and bool(ct.raw)
        body["nodes"] = [
            {
                "path": node,
                "device": _node_device(node),
                "minor": node_minor(node),
                # raw rules carry a number; devN entries are stat()ed by Proxmox at start
                "major": node_major(node, facts.char_devices) if raw else None,
            }
            for node in nodes
        ]
        body["driver"] = spec.driver.version if converged else None
        body["gpus"] = list(ctx["gpus"])  # type: ignore[call-overload]
        body["gsp"] = bool(spec.driver.open and converged)
        body["persistenced"] = bool(ctx["persistenced"] and converged)
        body["fabricmanager"] = bool(ctx["fabricmanager"] and converged)
    else:
        body["vfio"] = list(ctx["vfio"])  # type: ignore[call-overload]
        body["mappings"] = ctx["mappings"]
    return body


def plan_readiness(
    spec: HostSpec,
    facts: HostFacts,
    assignments: list[GpuAssignment],
    lxc_nodes: dict[int, tuple[str, ...]],
    vm_functions: dict[int, tuple[str, ...]],
    vm_split: VmSplit,
    containers: dict[int, ContainerDevices],
    driver: tuple[bool, bool, bool],
    problems: list[str],
) -> Readiness:
    """Hookscripts and contracts for every GPU guest that exists; the user's own hookscripts
    back on guests that have no GPUs any more. ``driver``: (the host runs the spec's driver
    once this run is done, the persistence daemon planned, the fabric manager planned)."""
    out = Readiness()
    files = facts.files or {}
    cfg = storages(files.get(STORAGE_CFG))
    names = {(g.kind if g.kind == "lxc" else "qemu", g.guest_id): g.name for g in spec.guests}
    gpu_guests: dict[tuple[str, int], dict[str, object]] = {}
    if spec.readiness.enabled:
        for ctid, nodes in lxc_nodes.items():
            gpus = [
                a.bdf for a in assignments
                if a.owner.kind == "lxc" and a.owner.id == ctid and a.driver_planned == "nvidia"
            ]  # fmt: skip
            gpu_guests[("lxc", ctid)] = {
                "nodes": nodes,
                "ct": containers.get(ctid),
                "gpus": gpus,
                "driver_runs": driver[0],
                "persistenced": driver[1],
                "fabricmanager": driver[2],
            }
        for vmid, functions in vm_functions.items():
            vm = vm_split.vms.get(vmid)
            # The mappings its hostpciN entries name once this run set them (a raw `host=`
            # entry gpuhost could not replace names none): each must still fit its board.
            config = facts.guest_configs.get(("qemu", vmid))
            entries = dict(config.current.options) if config else {}
            entries.update(vm.hostpci if vm else {})
            used = {m for k, v in entries.items() if k.startswith("hostpci")
                    for m in _MAPPING.findall(v)}  # fmt: skip
            mappings = [
                # its IOMMU group is the boot's (gpuhost-pci-mappings.service refreshes it)
                {"id": m.id, "path": m.path}
                for mid in (vm.mappings if vm else ())
                if mid in used and (m := vm_split.mappings.get(mid)) is not None
            ]
            gpu_guests[("qemu", vmid)] = {"vfio": functions, "mappings": mappings}
    existing = {key: facts.guest_configs.get(key) for key in gpu_guests}
    hooked = {k for k, c in facts.guest_configs.items()
              if c.current.options.get("hookscript") == HOOKSCRIPT_VOLID}  # fmt: skip
    recorded = {int(m[1]) for p in files if (m := _READY_FILE.fullmatch(p))}
    wanted_guests = {k for k, c in existing.items() if c is not None}
    if wanted_guests:
        local = cfg.get(SNIPPETS_STORAGE)
        if STORAGE_CFG in files and (
            local is None or local["type"] != "dir" or local.get("path") != "/var/lib/vz"
        ):
            problems.append(
                f"readiness: gpuhost's hookscript goes to {HOOKSCRIPT_VOLID} ({HOOKSCRIPT}), but "
                f"{STORAGE_CFG} has no dir storage '{SNIPPETS_STORAGE}' at /var/lib/vz; add it "
                "(pvesm add dir local --path /var/lib/vz --content snippets), or set "
                "readiness.enabled: false"
            )
            return out
        content = [c for c in (local or {}).get("content", "").split(",") if c]
        if local is not None and "snippets" not in content:
            out.snippets_content = ",".join([*content, "snippets"])
    for key in sorted(wanted_guests | hooked):
        kind, vmid = key
        config = facts.guest_configs[key]
        current = config.current.options.get("hookscript")
        chain = _recorded_chain(files, vmid)
        if current and current != HOOKSCRIPT_VOLID:
            chain = {"volid": current, "path": snippet_path(current, cfg) or ""}
        if key in wanted_guests:
            word = "CT" if kind == "lxc" else "VM"
            label = f"{word} {vmid}" + (f" ({names[key]})" if key in names else "")
            body = _contract(kind, vmid, label, spec, facts, gpu_guests[key])
            body["chain"] = chain
            out.contracts[key] = body
            out.hooks[key] = GuestHook(kind, vmid, HOOKSCRIPT_VOLID, current)
        else:  # no GPUs here (any more): the guest's own hookscript back, or none
            out.hooks[key] = GuestHook(kind, vmid, chain["volid"] if chain else None, current)
    statuses = facts.guest_statuses or {}
    for path, text in files.items():
        m = _HELD.fullmatch(path)
        boot, _, line = text.strip().partition(" ")
        if m is None or facts.boot_id is None or boot != facts.boot_id:
            continue
        for key in out.contracts:
            if key[1] == int(m[1]) and statuses.get(key) != "running":
                out.held[key] = line
    planned_ids = {vmid for _, vmid in out.contracts}
    for vmid in sorted(recorded - planned_ids):
        out.files[ready_path(vmid)] = ManagedFile(ready_path(vmid), None, CONCERN)
    for (_, vmid), body in out.contracts.items():
        text = json.dumps(body, indent=1, sort_keys=True) + "\n"
        out.files[ready_path(vmid)] = ManagedFile(ready_path(vmid), text, CONCERN)
    script = static_file("gpuhost-ready") if out.contracts else None
    out.files[HOOKSCRIPT] = ManagedFile(HOOKSCRIPT, script, CONCERN, mode="755")
    return out
