"""Guest hookscripts, run as Proxmox runs them (stdlib only).

pve-guest-common src/PVE/GuestHelpers.pm:
- check_hookscript: the `hookscript` volume id resolves through the storage config
  (PVE::Storage::path) to a volume of type `snippets` (`<storage>:snippets/<name>`, a dir-based
  storage's `<path>/snippets/<name>`, pve-storage Plugin.pm parse_volname/get_subdir), else
  "'<volid>' is not in the snippets directory"; then "script '<volid>' does not exist" and
  "script '<volid>' is not executable".
- exec_hookscript($conf, $vmid, $phase, $stop_on_error): nothing without a hookscript; runs
  `<path> <vmid> <phase>` with PVE::Tools::run_command (pve-common PVE/Cmd.pm: its stdout and
  stderr lines go to the task log; a non-zero exit dies "command '<path> <vmid> <phase>' failed:
  exit code N"); an error becomes "hookscript error for <vmid> on <phase>: <error>", fatal only
  with stop_on_error, otherwise a warning.
- Callers: pve-container src/PVE/LXC.pm vm_start (pre-start with stop_on_error, before
  `systemctl start pve-container@<vmid>`; post-start after it), vm_stop (pre-stop), and
  src/lxc-pve-poststop-hook (post-stop); qemu-server src/PVE/QemuServer.pm vm_start (pre-start
  with stop_on_error, post-start), _do_vm_stop (pre-stop), vm_stop_cleanup (post-stop). So
  `pct start`, `qm start`, the API's status/start and pve-manager's startall (Nodes.pm: it
  calls the same vm_start per guest) all run it.

Twin differences: an LXC post-stop runs when the twin stops the container (pct stop/shutdown),
not from LXC's own stop hook, so a container that stops by itself runs none. The script runs
in the twin: directly when the caller is in it (root "/"), else chrooted into the twin's root
(the supervisor's onboot start and the API server run outside it).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from .schema import PveError

# The environment of Proxmox's daemons, whose children hookscripts are; the twin's PATH (its
# systemctl and hardware tools are shims in /usr/local, twin/units.py ENV).
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


def storages(root: Path) -> dict[str, dict[str, str]]:
    """/etc/pve/storage.cfg: storage id -> {"type": ..., key: value}."""
    path = root / "etc/pve/storage.cfg"
    found: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in path.read_text().splitlines() if path.exists() else []:
        head = re.fullmatch(r"([a-z][a-z0-9]*):\s*(\S+)\s*", line)
        if head:
            current = found.setdefault(head[2], {"type": head[1]})
        elif line.strip() and current is not None:
            key, _, value = line.strip().partition(" ")
            current[key] = value.strip()
    return found


def resolve(root: Path, volid: str) -> str:
    """check_hookscript: the script's path on the host, or PveError with Proxmox's text."""
    storeid, _, volname = volid.partition(":")
    scfg = storages(root).get(storeid)
    if scfg is None:
        raise PveError(f"storage '{storeid}' does not exist\n")
    m = re.fullmatch(r"snippets/([^/]+)", volname)
    if m is None:
        raise PveError(f"'{volid}' is not in the snippets directory\n")
    base = scfg.get("path") or f"/mnt/pve/{storeid}"  # dir storages; network ones mount there
    path = f"{base.rstrip('/')}/snippets/{m[1]}"
    host_path = root / path.lstrip("/")
    if not host_path.is_file():
        raise PveError(f"script '{volid}' does not exist\n")
    if not host_path.stat().st_mode & 0o111:
        raise PveError(f"script '{volid}' is not executable\n")
    return path


def run(
    root: Path,
    values: dict[str, str],
    vmid: int,
    phase: str,
    stop_on_error: bool = False,
    log: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> None:
    """exec_hookscript. ``log`` gets the script's output lines (the task log); without
    stop_on_error a failure goes to ``warn``."""
    volid = values.get("hookscript")
    if not volid:
        return
    log = log or (lambda line: print(line, flush=True))
    try:
        path = resolve(root, volid)
        argv = [path, str(vmid), phase]
        if root.resolve() != Path("/"):
            argv = ["chroot", str(root), *argv]
        done = subprocess.run(
            argv, env=ENV, stdin=subprocess.DEVNULL, capture_output=True, text=True
        )
        for line in (done.stdout + done.stderr).splitlines():
            log(line)
        if done.returncode != 0:
            raise PveError(f"command '{path} {vmid} {phase}' failed: exit code {done.returncode}\n")
    except PveError as exc:
        message = f"hookscript error for {vmid} on {phase}: {exc.msg}"
        if stop_on_error:
            raise PveError(message) from None
        (warn or log)(message.rstrip("\n"))
