"""The ``start`` section of a profile made from a capture (twin/profile_start.py HostStart):
the captured host's files, running kernel, driver, guests, packages and os-release."""

from __future__ import annotations

from typing import Any

from gpuhost.observe.files import MODULE_CONFIG_PATHS
from gpuhost.observe.hostfacts import HostFacts
from gpuhost.observe.proxmox import _CONF_HEADER
from gpuhost.observe.snapshot import MISSING_TOOL
from gpuhost.paths import MANAGED_PATHS
from twin.fromcapture_secrets import redact, secret_path

# Proxmox's own files among those gpuhost reads, which a twin keeps as its own: the node link
# (/etc/pve/local -> nodes/<node>, the twin's node is its hostname) and the cluster CA (the
# twin's API presents its own certificate; the host's private key is never captured).
TWIN_OWNED = ("/etc/pve/local", "/etc/pve/pve-root-ca.pem")


def files(facts: HostFacts, assumed: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Captured files and links (gpuhost's managed paths and the module configuration), without
    secrets: secret files are left out, secret entries in the others redacted."""
    out: dict[str, str] = {}
    links: dict[str, str] = {}
    left_out: list[str] = []
    for read in (facts.managed, facts.module_config):
        if read is None:
            continue
        for path, text in read.files.items():
            if path in TWIN_OWNED:
                continue
            if secret_path(path):
                left_out.append(path)
                continue
            out[path] = redact(text)
        for path, target in read.links.items():
            if path in TWIN_OWNED:
                continue
            if secret_path(path):
                left_out.append(path)
                continue
            links[path] = target
    if facts.managed is None:
        assumed.append(
            "start.files: gpuhost's managed files were not captured (no ConfigFiles): none"
        )
    if facts.module_config is None:
        assumed.append(
            "start.files: /etc/modprobe.d, /etc/modules-load.d and /etc/modules were not"
            " captured (no ModuleConfigFiles): the twin's own (none of the host's)"
        )
    if left_out:
        # the paths only: a path that names a secret says nothing of the secret itself
        assumed.append(f"start.files: left out as secret: {', '.join(sorted(left_out))}")
    return dict(sorted(out.items())), dict(sorted(links.items()))


def guest_texts(raw_lines: list[str]) -> dict[tuple[str, int], str]:
    """Each guest config's text exactly as captured, split at PveGuestConfigs' file headers
    (the same headers gpuhost's parser splits at)."""
    texts: dict[tuple[str, int], list[str]] = {}
    key: tuple[str, int] | None = None
    for line in raw_lines:
        header = _CONF_HEADER.match(line)
        if header:
            key = ("lxc" if header["kind"] == "lxc" else "qemu", int(header["id"]))
            texts[key] = []
        elif key is not None:
            texts[key].append(line)
    return {k: "".join(line + "\n" for line in v) for k, v in texts.items()}


def guests(facts: HostFacts, raw_lines: list[str], assumed: list[str]) -> list[dict[str, Any]]:
    texts = guest_texts(raw_lines)
    statuses = facts.guest_statuses
    out = []
    for kind, vmid in sorted(facts.guest_configs):
        running = statuses is not None and statuses.get((kind, vmid)) == "running"
        out.append(
            {
                "kind": kind,
                "vmid": vmid,
                "config": redact(texts.get((kind, vmid), "")),
                "running": running,
            }
        )
    if out and statuses is None:
        assumed.append(
            "start.guests[*].running: false (which guests ran was not captured: no GuestStatuses)"
        )
    return out


def host_start(facts: HostFacts, raw: dict, assumed: list[str]) -> dict[str, Any]:
    start: dict[str, Any] = {}
    start["files"], start["links"] = files(facts, assumed)
    # the globs a captured fact read in full: there the twin keeps only what the capture holds
    exact: list[str] = []
    if facts.managed is not None:
        # /etc/pve's only where the snapshot shows it is new enough: ConfigFiles read them from
        # 2026-12-02 on (storage.cfg from 12-04), and a snapshot does not keep the command that
        # took it; one with ModuleConfigFiles (added after) read them all. Elsewhere the twin
        # keeps its Proxmox install's own there, unless the capture holds one.
        new = "ModuleConfigFiles" in raw
        exact += [g for g in MANAGED_PATHS if new or not g.startswith("/etc/pve/")]
    if facts.module_config is not None:
        exact += MODULE_CONFIG_PATHS
    start["exact"] = exact
    start["running_kernel"] = facts.kernel.release
    start["cmdline"] = " ".join(facts.cmdline)  # what booted, as /proc/cmdline showed it
    if facts.driver is not None:
        loaded = None
        if facts.loaded_modules is not None:
            loaded = [m for m in facts.loaded_modules if m.startswith("nvidia")]
        else:
            # ModuleParameters lists only loaded modules (/sys/module/<m>/parameters), and the
            # driver's version file exists only while nvidia is loaded
            loaded = [m for m in facts.module_parameters if m.startswith("nvidia_")]
            loaded.append("nvidia")
            assumed.append(
                f"start.driver.loaded: {', '.join(loaded)}: the NVIDIA modules with live"
                " parameters (ModuleParameters) and nvidia itself (NvidiaDriver); no"
                " LoadedModules in the capture"
            )
        start["driver"] = {
            "version": facts.driver.version,
            "open": facts.driver.open,
            "loaded": loaded,
        }
    start["guests"] = guests(facts, raw.get("PveGuestConfigs", (0, []))[1], assumed)
    packages = {
        "pve-manager": facts.release.pve_manager,
        "qemu-server": facts.release.qemu_server,
        "pve-container": facts.pve_container.version if facts.pve_container else None,
    }
    # {}: the host had none of them; None: not captured (the profile's Proxmox release's own)
    start["packages"] = {k: v for k, v in packages.items() if v}
    if "HostRelease" not in raw and raw.get("BootTool", (0, []))[0] == MISSING_TOOL:
        # proxmox-boot-tool comes with proxmox-kernel-helper, part of every Proxmox VE install
        # (`pveversion -v` lists it): a host without it has no Proxmox VE
        assumed.append(
            "start.packages: none (no HostRelease; proxmox-boot-tool was absent, BootTool exit"
            " status 127, so the host had no Proxmox VE); start.os_release: the twin's own"
        )
    elif "HostRelease" not in raw:
        start["packages"] = None
        assumed.append(
            "start.packages, start.os_release: not captured (no HostRelease): those of the"
            " twin's Proxmox VE release"
        )
    release = facts.release
    os_release = {
        "ID": release.distribution,
        "VERSION_ID": release.debian,
        "VERSION_CODENAME": release.codename,
    }
    start["os_release"] = {k: v for k, v in os_release.items() if v}
    return start
