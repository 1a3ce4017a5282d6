"""`gpuhost rehearse` before the twin runs: the inventory's host, the one read of it (or a saved
snapshot), the rehearsal's directory, the profile made from the read, the twin's index, and the
inventory that holds only the twin.

Everything that can be refused is refused here, before a twin starts: an unknown host, an
inventory of several hosts without --host, a --facts directory that is not a snapshot, a twin
index that is taken, a capture the converter cannot make a profile of.
"""

from __future__ import annotations

import os
import pprint
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhost.observe.hostfacts import parse_raw, read_snapshot, write_snapshot
from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import load_inventory
from twin import demo_guests, node

REHEARSALS = "rehearsals"  # under the twin state root (node.STATE_ROOT)
INDEX_ENV = "GPUHOST_REHEARSE_INDEX"  # the twin's index when --index is not given
MAX_INDEX = 254  # 127.0.0.255 is the loopback broadcast

Raw = dict[str, tuple[int, list[str]]]


class RehearseError(ValueError):
    """Input the rehearsal refuses (gpuhost's main reports it in one line)."""


@dataclass(frozen=True)
class Target:
    """The inventory's host the rehearsal stands for."""

    name: str
    spec: HostSpec
    inventory: Path


def choose_host(inventory: str, host: str | None) -> Target:
    """The inventory's host: --host, or its only host."""
    path = Path(inventory)
    if not path.is_file():
        raise RehearseError(f"{inventory}: no such inventory file")
    hosts = load_inventory(path)  # a bad spec is refused here, naming the field
    if not hosts:
        raise RehearseError(f"{inventory}: declares no host with gpu_host(); nothing to rehearse")
    if host is None:
        if len(hosts) > 1:
            raise RehearseError(
                f"{inventory} has {len(hosts)} hosts ({', '.join(hosts)}): choose one with --host"
            )
        host = next(iter(hosts))
    if host not in hosts:
        raise RehearseError(f"{inventory}: no host {host!r} (hosts: {', '.join(hosts)})")
    return Target(host, hosts[host][0], path)


def read_saved(directory: str) -> Raw:
    """A snapshot `gpuhost capture` wrote; refused, saying how to make one, when it is not."""
    path = Path(directory)
    hint = "make one with: gpuhost capture INVENTORY --host H --out DIR"
    if not path.is_dir():
        raise RehearseError(f"--facts {directory}: not a directory; {hint}")
    try:
        raw = read_snapshot(path)
        parse_raw(raw)
    except FileNotFoundError as exc:
        raise RehearseError(f"--facts {directory} is not a fact snapshot ({exc}); {hint}") from None
    except ValueError as exc:
        raise RehearseError(f"--facts {directory}: a fact does not parse: {exc}") from None
    return raw


def read_live(target: Target) -> Raw:
    """The host's facts in one SSH command: the only connection the rehearsal makes to it."""
    from gpuhost.observe.live import gather_live

    return gather_live(str(target.inventory), target.name)[target.name]


def pick_index(requested: int | None) -> int:
    """The twin's index: --index, else $GPUHOST_REHEARSE_INDEX, else the highest developer index
    no twin holds (from 199 down: `gpuhost twin` and the benchmarks take twin1 up)."""
    taken = {t.index for t in node.list_twins()}
    taken |= {int(p.name[4:]) for p in node.STATE_ROOT.glob("twin*") if p.name[4:].isdigit()}
    if requested is None and os.environ.get(INDEX_ENV):
        value = os.environ[INDEX_ENV]
        if not value.isdigit():
            raise RehearseError(f"{INDEX_ENV}={value!r}: give a twin index (1-{MAX_INDEX})")
        requested = int(value)
    if requested is None:
        free = [i for i in range(node.FIRST_TEST_INDEX - 1, 0, -1) if i not in taken]
        if not free:
            raise RehearseError(
                "every developer twin index is taken; stop one (python -m twin list)"
            )
        return free[0]
    if not 1 <= requested <= MAX_INDEX:
        raise RehearseError(f"--index {requested}: a twin index is 1-{MAX_INDEX}")
    if requested in taken:
        name = node.twin_name(requested)
        raise RehearseError(
            f"--index {requested}: {name} exists already; pick another index or stop it "
            f"(python -m twin stop {name})"
        )
    return requested


def rehearsal_dir(host: str) -> Path:
    """A new directory for this rehearsal, root's only: the snapshot in it is the host's read."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = node.STATE_ROOT / REHEARSALS / f"{host}-{stamp}"
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    path.mkdir(mode=0o700)
    return path


def keep_snapshot(where: Path, raw: Raw) -> Path:
    """The read, as `gpuhost capture` writes it, without its secrets (the profile's rule,
    twin/fromcapture_secrets.py): a later rehearsal can start from it (--facts)."""
    from twin.fromcapture_secrets import redact_snapshot

    path = where / "snapshot"
    write_snapshot(path, redact_snapshot(raw))
    return path


def make_profile(raw: Raw, name: str, source: str, path: Path) -> Any:
    """The twin profile of the capture (the converter's), written to ``path`` and loaded back."""
    from twin.fromcapture import profile_from_snapshot, write_profile
    from twin.profile import ProfileError, load_profile, parse_profile

    try:
        data = profile_from_snapshot(raw, name=name, source=source)
        parse_profile(data, source)
    except (ProfileError, ValueError, KeyError) as exc:
        raise RehearseError(f"{source}: no twin profile can be made of it: {exc}") from None
    write_profile(data, path)
    return load_profile(path)


def twin_containers(twin: node.Twin, spec: HostSpec) -> set[int]:
    """The spec's containers the twin has (made from the read); when one of them asks for CUDA,
    the twin's local mirror of NVIDIA's repository is made for it (twin/demo_guests.py)."""
    listed = demo_guests.listing(twin)
    present = {g["vmid"] for g in listed if g["kind"] == "lxc"}
    wanted = [
        g.model_dump(mode="json")
        for g in spec.guests
        if g.kind == "lxc" and g.guest_id in present and getattr(g, "cuda", None)
    ]
    if wanted:
        demo_guests.ensure(twin, wanted, None)  # creates none of them: each exists
    return present


def twin_spec(spec: HostSpec, twin: node.Twin, present: set[int]) -> dict[str, Any]:
    """The inventory's spec with the twin's own connections: its API token (and address), its
    containers' SSH addresses, its local CUDA mirror (twin/demo_guests.py); so nothing in it
    points at the real host, its guests or their package sources (inventory/twin.py's
    ``_spec`` does the same for the demo twins). ``present``: the containers the twin has."""
    data = spec.model_dump(mode="json")
    data["proxmox"] = {"token_file": str(twin.dir / "api-token")}  # a 0600 file, made at start
    for guest in data.get("guests", []):
        if guest.get("kind", "lxc") != "lxc":
            continue
        # reached as the user reaches it: over SSH (at its address on the twin, once the twin
        # has it and so its host key) or, without an address, through `pct exec` on the twin
        access = guest.get("access") or {}
        if access.get("ssh_hostname"):
            made = (twin.dir / "guests" / str(guest["ctid"])).is_dir()
            guest["access"] = {"ssh_hostname": twin.guest_address(guest["ctid"])} if made else {}
        mirror = demo_guests.mirror_key(twin)
        if guest.get("cuda") and guest["ctid"] in present and mirror.exists():
            guest["cuda_repo"] = {"url": demo_guests.mirror_url(twin), "keyring": str(mirror)}
        elif guest.get("cuda_repo"):
            guest["cuda_repo"] = None  # no container on the twin to fetch it: nothing of yours
    return data


def write_inventory(path: Path, host: str, spec: dict[str, Any], twin: node.Twin) -> Path:
    """An inventory file holding the twin alone, under the host's name, with host keys checked;
    the user can run pyinfra and `gpuhost audit` on it again while the twin runs."""
    path.write_text(
        f'"""gpuhost rehearse: {host}\'s spec on twin {twin.name} ({twin.address}) only."""\n\n'
        "from gpuhost.spec.inventory import gpu_host\n\n"
        f"SPEC = {pprint.pformat(spec, width=96, sort_dicts=False)}\n\n"
        "hosts = [\n"
        f"    gpu_host(\n        {host!r},\n        SPEC,\n"
        f"        ssh_hostname={twin.address!r},\n        ssh_user='root',\n"
        f"        ssh_key={str(node.client_key())!r},\n"
        f"        ssh_known_hosts_file={str(node.known_hosts())!r},\n"
        "        ssh_strict_host_key_checking='yes',\n"
        "        gpuhost_reboot_delay=1,  # a twin is back in well under a second\n"
        "    ),\n]\n"
    )
    return path
