"""Boot-time units of a twin: the one piece of systemd's boot the twin runs.

At every (re)boot, after the simulated modules load (twin.boot) and before the guests with
`onboot: 1` start (pve-guests), ``run_boot_units(root)`` runs each Type=oneshot or
Type=forking unit enabled in /etc/systemd/system/multi-user.target.wants/, in name order: its
ConditionPathExists= checks, then each ExecStart= line through /bin/sh, chrooted into the twin's
root, as root, with a plain environment and stdin on /dev/null. A line prefixed "-" may fail. A
forking unit has started when its ExecStart returns 0, as systemd reads it: the daemon it left
behind must detach from the caller's stdout/stderr (real daemons close them), or the boot waits
for it until the timeout. A failure is recorded as
/run/gpuhost-twin/systemd/<unit>.failed (the exit status and output), which the systemctl shim
shows as failed; success is recorded as <unit>.started.

Not simulated: Type=simple/notify/exec units, targets, ordering between units (After=/Before= are not
read), ExecStartPre/Post (except the drop-ins' ExecStartPre of pve-guests.service, which the
supervisor runs before the onboot guests start: ``drop_in_exec_start_pre``), User=,
Environment=, timeouts other than a fixed one.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

WANTS = "etc/systemd/system/multi-user.target.wants"
UNIT_DIRS = (
    "etc/systemd/system",
    "run/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
)
RUN = "run/gpuhost-twin/systemd"
ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}
TIMEOUT = 120


def service(path: Path) -> dict[str, list[str]]:
    """The [Unit] and [Service] keys of a unit file (repeated keys kept in order)."""
    keys: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text(errors="replace").splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif "=" in line and not line.startswith(("#", ";")) and section in ("[Unit]", "[Service]"):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def unit_file(root: Path, name: str) -> Path | None:
    for d in UNIT_DIRS:
        if (root / d / name).is_file():
            return root / d / name
    return None


def drop_in_exec_start_pre(root: Path, unit: str) -> list[str]:
    """The ExecStartPre= lines the drop-ins (<unit>.d/*.conf, in file name order across the unit
    directories, /etc first for a name in several: systemd.unit(5) "drop-in") add to ``unit``."""
    confs: dict[str, Path] = {}
    for d in UNIT_DIRS:
        folder = Path(root) / d / f"{unit}.d"
        for conf in sorted(folder.glob("*.conf")) if folder.is_dir() else []:
            confs.setdefault(conf.name, conf)
    return [line for name in sorted(confs) for line in service(confs[name]).get("ExecStartPre", [])]


def run_boot_units(root: Path) -> dict[str, int]:
    """Run the enabled oneshot units; {unit: exit status} of those that ran."""
    root = Path(root)
    wants = root / WANTS
    results: dict[str, int] = {}
    state = root / RUN
    state.mkdir(parents=True, exist_ok=True)
    for link in sorted(wants.iterdir()) if wants.is_dir() else []:
        path = unit_file(root, link.name)
        if path is None or not link.name.endswith(".service"):
            continue
        keys = service(path)
        if keys.get("Type", ["simple"])[-1] not in ("oneshot", "forking"):
            continue
        if not all(_condition(root, c) for c in keys.get("ConditionPathExists", [])):
            continue
        rc, output = 0, ""
        for line in keys.get("ExecStart", []):
            optional = line.startswith("-")
            cmd = line.lstrip("-@+!:")
            try:
                proc = subprocess.run(
                    ["chroot", str(root), "/bin/sh", "-c", cmd],
                    env=ENV,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    timeout=TIMEOUT,
                    check=False,
                )
                code, output = proc.returncode, output + proc.stdout + proc.stderr
            except subprocess.TimeoutExpired:
                code, output = 124, output + f"timed out after {TIMEOUT}s\n"
            if code and not optional:
                rc = code
                break
        results[link.name] = rc
        (state / f"{link.name}.started").unlink(missing_ok=True)
        (state / f"{link.name}.failed").unlink(missing_ok=True)
        if rc:
            (state / f"{link.name}.failed").write_text(f"status={rc}\n{output}")
        else:
            (state / f"{link.name}.started").write_text("")
    return results


def _condition(root: Path, value: str) -> bool:
    negate = value.startswith("!")
    path = value.lstrip("!|")
    return (root / path.lstrip("/")).exists() != negate
