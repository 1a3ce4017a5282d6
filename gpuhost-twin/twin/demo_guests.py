"""The guests of a demo twin: those its spec names, created as a user creates them on Proxmox.

`gpuhost twin` gives a twin the guests its spec names before the deploy, so that the deploy, the
audit and the guest software deploy run on it as on the real host: each container with
`pct create` and then `pct start`, each VM with `qm create` (left stopped: a twin runs no VM's
operating system), as commands over SSH on the twin. Their GPUs are the deploy's to give, as on
a host whose guests were made before gpuhost ran. A guest that exists is left as it is.

The containers' CUDA toolkits come from a local mirror of NVIDIA's repository on the twin: the
stand-in repository of twin/cudarepo.py in /srv/cuda-mirror, served over http by the twin itself
(a forking boot unit, so it is back after every reboot), its signing key kept beside the twin's
API token. ``inventory/twin.py`` names both in the containers' ``cuda_repo`` and lists the twin's
running containers as guest hosts (``listing`` reads the twin's guests through its Proxmox API,
in-process: no SSH round trip on every pyinfra run).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from twin import cudarepo, node, userspace
from twin import driver as twin_driver
from twin.errors import TwinError
from twin.pve import routes

MIRROR = "/srv/cuda-mirror"  # in the twin
MIRROR_PORT = 8008
MIRROR_UNIT = "gpuhost-twin-cuda-mirror.service"
CUDA = ("12.8", "12.9", "13.0", "13.1")  # the stand-in toolkits the mirror carries
# The container template a user downloads with pveam first; the twin makes each container's root
# from its own base instead, so only the name is shown.
TEMPLATES = {
    "12": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst",
    "13": "local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst",
}


def mirror_url(twin: node.Twin) -> str:
    return f"http://{twin.address}:{MIRROR_PORT}/"


def mirror_key(twin: node.Twin) -> Path:
    """The mirror's signing key, on the control machine (the spec's ``cuda_repo.keyring``)."""
    return twin.dir / "cuda-mirror.asc"


def ensure(twin: node.Twin, guests: list[dict[str, Any]], driver: str | None) -> list[str]:
    """Create those of ``guests`` (spec entries, JSON form) the twin lacks, give GPU containers
    the NVIDIA userspace of ``driver`` (the host's version; None: no driver) and make the CUDA
    mirror when a container asks for CUDA; returns what was done, to show."""
    have = {(g["kind"], g["vmid"]) for g in listing(twin)}
    script = []
    release = _release(twin)
    for guest in guests:
        if guest["kind"] == "lxc" and ("lxc", guest["ctid"]) not in have:
            ctid = guest["ctid"]
            script.append(
                f"pct create {ctid} {TEMPLATES[release]} --hostname {shlex.quote(guest['name'])} "
                f"--ostype debian --rootfs local-zfs:8 --memory 65536 --cores 32 --onboot 1"
                + ("" if guest.get("privileged") else " --unprivileged 1")
            )
            script.append(f"pct start {ctid}")
        elif guest["kind"] == "vm" and ("qemu", guest["vmid"]) not in have:
            script.append(
                f"qm create {guest['vmid']} --name {shlex.quote(guest['name'])} "
                f"--machine {shlex.quote(guest.get('machine', 'q35'))} --ostype l26 "
                f"--memory 65536 --cores 16 --scsi0 local-zfs:64"
            )
    wants_cuda = any(g["kind"] == "lxc" and g.get("cuda") for g in guests)
    done = list(script)
    if wants_cuda and not mirror_key(twin).exists():
        _mirror(twin)
        script.insert(0, _serve_command(twin))
        done.insert(0, f"a local mirror of NVIDIA's CUDA repository (stand-in): {mirror_url(twin)}")
    if script:
        _ssh(twin, "set -e\n" + "\n".join(script))
    for guest in guests:
        if guest["kind"] == "lxc" and guest.get("gpus") and driver and not _userspace(twin, guest):
            # what `NVIDIA-Linux-x86_64-<driver>.run --no-kernel-modules` does inside a container
            twin_driver.install_userspace(twin, guest["ctid"], driver)
            done.append(
                f"CT {guest['ctid']}: NVIDIA userspace {driver} (the .run, --no-kernel-modules)"
            )
    return done


def _userspace(twin: node.Twin, guest: dict[str, Any]) -> bool:
    """Whether the container has an NVIDIA userspace (its own layer: running or not)."""
    upper = twin.dir / "guests" / str(guest["ctid"]) / "upper"
    return any((upper / userspace.LIBDIR).glob("libcuda.so.*.*"))


def _mirror(twin: node.Twin) -> None:
    """Build the stand-in repository into the twin and enable the unit that serves it."""
    repo = cudarepo.build(twin.root / MIRROR.lstrip("/"), CUDA)
    unit = twin.root / "etc/systemd/system" / MIRROR_UNIT
    unit.write_text(
        "[Unit]\nDescription=Local mirror of NVIDIA's CUDA repository (gpuhost twin stand-in)\n"
        f"[Service]\nType=forking\nExecStart=/bin/sh -c {shlex.quote(_serve_command(twin))}\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    wants = twin.root / "etc/systemd/system/multi-user.target.wants" / MIRROR_UNIT
    wants.parent.mkdir(parents=True, exist_ok=True)
    if not wants.is_symlink():
        wants.symlink_to(f"/etc/systemd/system/{MIRROR_UNIT}")
    mirror_key(twin).write_bytes(repo.key.read_bytes())  # last: it marks the mirror as made


def _serve_command(twin: node.Twin) -> str:
    # detached from the caller's output, as the twin's boot units need of a forking daemon
    return (
        f"setsid python3 -m http.server {MIRROR_PORT} --bind {twin.address} "
        f"--directory {MIRROR}/repo </dev/null >/dev/null 2>&1 &"
    )


def listing(twin: node.Twin) -> list[dict[str, Any]]:
    """The twin's guests as gpuhost.pve.guests.list_guests gives them (kind, vmid, name, status,
    config), from the twin's own Proxmox API."""
    found = []
    (node_name,) = [n["node"] for n in routes.call(twin.root, "GET", "/nodes", {}).data]  # type: ignore[union-attr]
    for kind in ("lxc", "qemu"):
        base = f"/nodes/{node_name}/{kind}"
        for guest in routes.call(twin.root, "GET", base, {}).data:  # type: ignore[union-attr]
            vmid = int(guest["vmid"])
            config = routes.call(twin.root, "GET", f"{base}/{vmid}/config", {}).data
            found.append(
                {
                    "kind": kind,
                    "vmid": vmid,
                    "name": str(guest.get("name") or vmid),
                    "status": str(guest.get("status", "unknown")),
                    "config": config,
                }
            )
    return found


def _release(twin: node.Twin) -> str:
    for line in (twin.root / "etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_ID="):
            return line.split("=", 1)[1].strip('"')
    raise TwinError(f"{twin.name}: no VERSION_ID in /etc/os-release")


def _ssh(twin: node.Twin, command: str) -> None:
    print(twin_driver.ssh(twin, command, timeout=120), end="", file=sys.stderr)
