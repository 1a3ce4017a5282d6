"""The Proxmox VE version the twin reports: GET /version and `pveversion`, from the pve-manager
version dpkg has (a twin made from a capture registers the captured one: pve/setup.py).

pve-manager bakes its version into PVE::pvecfg at build time (PVE/pvecfg.pm.in: version,
release, repoid; version_info is what the API's /version returns) and bin/pveversion prints
``pve-manager/<version>/<repoid> (running kernel: <uname -r>)``, with --verbose one
``<package>: <version>`` line per package of PVE::API2::APT versions (stdlib only).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from . import config as cfg
from .clihandler import Output
from .guest_status import PVE_VERSIONS

# Packages of PVE::API2::APT's version list that the twin may have registered, in its order.
VERBOSE = ("proxmox-ve", "pve-manager", "pve-kernel-helper", "pve-container", "qemu-server")


def installed(root: Path) -> dict[str, str]:
    """Package -> version of what dpkg's status lists as installed."""
    status = root / "var/lib/dpkg/status"
    found: dict[str, str] = {}
    text = status.read_text(errors="replace") if status.is_file() else ""
    for stanza in text.split("\n\n"):
        keys = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if keys.get("Status") == "install ok installed" and "Package" in keys:
            found[keys["Package"]] = keys.get("Version", "")
    return found


def version_info(root: Path) -> dict[str, str]:
    """PVE::pvecfg::version_info of the pve-manager dpkg has (the release's when absent)."""
    info = dict(PVE_VERSIONS[cfg.pve_release(root)])
    version = installed(root).get("pve-manager")
    if version and version != info["version"]:
        # The capture reads the package version, not the git commit it was built from: a
        # stand-in repoid, 16 hex digits like the real one, fixed per version.
        repoid = hashlib.sha256(f"pve-manager {version}".encode()).hexdigest()[:16]
        release = ".".join(version.split(".")[:2])
        info = {"version": version, "release": release, "repoid": repoid}
    return info


def pveversion(root: Path, argv: list[str], out: Output) -> int:
    if argv not in ([], ["--verbose"], ["-v"]):
        out.err("USAGE: pveversion [--verbose]")
        return 255
    info = version_info(root)
    osrelease = root / "proc/sys/kernel/osrelease"
    kver = osrelease.read_text().strip() if osrelease.exists() else ""
    if not argv:
        out.out(f"pve-manager/{info['version']}/{info['repoid']} (running kernel: {kver})")
        return 0
    have = installed(root)
    for package in VERBOSE:
        if package == "pve-manager" and package in have:
            running = f"{info['version']}/{info['repoid']}"
            out.out(f"{package}: {have[package]} (running version: {running})")
        elif package in have:
            out.out(f"{package}: {have[package]}")
    return 0
