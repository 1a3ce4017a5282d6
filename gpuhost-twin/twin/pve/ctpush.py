"""pct push: copy a file of the node into a running container (stdlib only).

pve-container PVE::CLI::pct push refuses a container that is not running ("can only push files
to a running CT"), opens the source first ("failed to open <file> for reading"), assumes octal
perms, then enters the container's mount namespace to create the file there; on the twin the
supervisor does that part (guests.push, through lxc-attach).
"""

from __future__ import annotations

from pathlib import Path

from . import config as cfg
from .guest_state import is_running, supervisor_request
from .schema import PveError


def push_lxc(root: Path, vmid: int, file: str, dest: str, perms: str | None) -> dict[str, object]:
    """pct push (pve-container PVE::CLI::pct push): a running CT only; the file is created
    from inside the container (its mount namespace), so the supervisor writes it there."""
    cfg.load_config(root, "lxc", vmid)
    if not is_running(root, "lxc", vmid):
        raise PveError("can only push files to a running CT")
    if not (root / file.lstrip("/")).is_file():
        raise PveError(f"failed to open {file} for reading")
    if perms is not None and not perms.startswith("0"):
        perms = f"0{perms}"  # pct assumes octal
    request = {"op": "ct-push", "ctid": vmid, "file": file, "dest": dest, "perms": perms}
    return supervisor_request(root, request)
