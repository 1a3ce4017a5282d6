"""A twin's in-place upgrade from Proxmox VE 8 to 9, as Proxmox's "Upgrade from 8 to 9" does it.

Sources: Proxmox VE wiki "Upgrade from 8 to 9" (apt sources to trixie, `apt dist-upgrade`, reboot
into the PVE 9 kernel) and pve-manager's checker PVE/CLI/pve8to9.pm (HEAD 2385f49c):
`check_pve_packages` wants proxmox-ve >= 8.4-0 before and a 6.14+ kernel running after, and tells
the user that the old kernel meta-packages (pve-kernel-6.8 ...) stay installed until removed by
hand; `check_dkms_modules` warns that out-of-tree modules are not carried over.

What the upgrade changes, and what it keeps, in the twin:
  - userland: the twin's overlay gets the Debian 13 base as its lower layer (trixie's apt sources,
    gcc-14, kmod, initramfs-tools, python3.13, os-release); its upper layer, everything written
    since the twin was made, stays: /etc (modprobe.d, modules-load.d, kernel cmdline and pins,
    /etc/pve with the guests' configs, units), /boot, /lib/modules, firmware, diversions.
    dpkg's database becomes trixie's plus every package installed after the base, with the
    Proxmox packages at their PVE 9 versions; a diverted file gets the new package's copy, as
    dpkg writes an upgraded diverted file to its divert-to name.
  - kernel: the target profile's kernels are installed beside the old ones (proxmox-kernel-6.14
    comes with proxmox-ve 9; the old ones stay), each with its kernel package's postinst hooks
    (`run-parts /etc/kernel/postinst.d`: initramfs, proxmox-boot-tool's ESP sync). A kernel pin
    (/etc/kernel/proxmox-boot-pin) stays: the reboot boots what the loader holds, pinned or newest.
  - modules: nothing builds the NVIDIA modules for the new kernel (no DKMS on a gpuhost host): the
    old kernels keep theirs, the new one has none.
  - compilers: the previous release's gcc-12 12.2.0 is gone (trixie's gcc-12 is 12.4.0, which
    dist-upgrade would bring, or `apt autoremove` drops); the trixie base has gcc-14 only.
  - guests: containers keep their own Debian (a host upgrade does not upgrade them): each guest's
    overlay stays on the base it was made on.
Not simulated: the old kernels' headers (a symlink farm on Debian 12's headers) dangle after the
switch, where Proxmox's proxmox-headers packages would stay whole; no module build needs them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from twin import boot, hardware, lifecycle, node, pve, rootfs
from twin.errors import TwinError
from twin.mounts import mount_overlay, unmount_below
from twin.processes import _alive
from twin.pve.config import TWIN_STATE

SAME_HARDWARE = ("hostname", "cpu", "memory_gib", "boot", "pci_devices", "gpus", "topology")


def upgrade(name: str, target: str) -> node.Twin:
    """Upgrade twin `name` in place to the profile `target` (its PVE 9 self) and reboot it."""
    twin = node.Twin.load(name)
    if twin.profile is None:
        raise TwinError(f"{name} is a bare twin: only a Proxmox twin (with a profile) upgrades")
    old, new = node.load_profile(twin.profile), node.load_profile(target)
    if (old.pve, new.pve) != (8, 9):
        raise TwinError(
            f"upgrade goes from PVE 8 to 9; {twin.profile} is {old.pve}, {target} {new.pve}"
        )
    differs = [f for f in SAME_HARDWARE if getattr(old, f) != getattr(new, f)]
    if differs:
        raise TwinError(f"{target} is not {twin.profile}'s machine: {', '.join(differs)} differ")
    base = rootfs.ensure_base(suite=new.debian_suite)
    old_base = Path(twin.base)
    for gdir in (twin.dir / "guests").glob("*"):
        if gdir.name.isdigit() and not (gdir / "base").exists():
            (gdir / "base").write_text(f"{old_base}\n")  # the container keeps its Debian
    _halt(twin)
    upper = twin.dir / "upper"
    _merge_dpkg_status(upper, old_base, base)
    upgraded = node.Twin(twin.name, twin.index, target, str(base))
    upgraded.save()
    mount_overlay(base, upper, twin.dir / "work", twin.root)
    root = twin.root
    _refresh_diverted(root, base)
    boot.write_profile(root, new)
    info_path = root / TWIN_STATE / "pve.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "pve": new.pve}, indent=1) + "\n")
    pve._register_packages(root, new.pve)
    (root / "etc/ld.so.cache").unlink(missing_ok=True)  # libc6's trigger runs ldconfig
    _chroot(root, "ldconfig")
    installed = {p.name.removeprefix("vmlinuz-") for p in (root / "boot").glob("vmlinuz-*")}
    for kernel in new.kernels:
        if kernel.version not in installed:
            hardware.add_kernel(root, kernel)
            _chroot(
                root,
                "run-parts", "--report", f"--arg={kernel.version}",
                f"--arg=/boot/vmlinuz-{kernel.version}", "/etc/kernel/postinst.d",
            )  # fmt: skip
    lifecycle.start(upgraded)  # the reboot that ends the upgrade
    return upgraded


def _halt(twin: node.Twin) -> None:
    """Shut the twin down (guests, sessions, sshd, supervisor) and unmount it, state kept."""
    try:
        pid = int((twin.dir / "supervisor.pid").read_text())
    except (FileNotFoundError, ValueError):
        pid = 0
    if pid and node.is_supervisor(pid, twin.dir):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    from twin import guests
    from twin.processes import kill_processes

    guests.stop_all(twin.dir)
    kill_processes(twin.dir)
    unmount_below(twin.dir)


def _stanzas(path: Path) -> dict[str, str]:
    text = path.read_text() if path.is_file() else ""
    found = {}
    for stanza in re.split(r"\n\s*\n", text.strip()):
        m = re.search(r"^Package: (\S+)$", stanza, re.M)
        if m:
            found[m.group(1)] = stanza.strip()
    return found


def _merge_dpkg_status(upper: Path, old_base: Path, new_base: Path) -> None:
    """dpkg's status after dist-upgrade: the new release's packages, plus those installed after
    the base (kept as they were), less the Proxmox stand-ins (re-registered at their new
    versions by pve._register_packages)."""
    rel = "var/lib/dpkg/status"
    if not (upper / rel).is_file():
        return  # nothing installed since the base: the new base's database shows through
    mine, before = _stanzas(upper / rel), _stanzas(old_base / rel)
    stand_ins = {p for release in pve.RELEASE_PACKAGES.values() for p in release}
    merged = _stanzas(new_base / rel)
    for package, stanza in mine.items():
        if package not in before and package not in merged and package not in stand_ins:
            merged[package] = stanza
    (upper / rel).write_text("\n\n".join(merged.values()) + "\n")


def _refresh_diverted(root: Path, new_base: Path) -> None:
    """An upgraded package writes a diverted file to its divert-to name (dpkg-divert(1)): the
    twin's own (local) diversions of the hardware tools get the new release's binaries."""
    table = root / "var/lib/dpkg/diversions"
    lines = table.read_text().splitlines() if table.is_file() else []
    for path, divert_to, owner in zip(lines[0::3], lines[1::3], lines[2::3], strict=False):
        fresh = hardware._resolve(new_base, path)
        if owner != ":" or not (fresh.is_file() or fresh.is_symlink()):
            continue
        dest = hardware._resolve(root, divert_to)
        if dest.is_symlink() or dest.exists():
            dest.unlink()
        shutil.copy2(fresh, dest, follow_symlinks=False)


def _chroot(root: Path, *argv: str) -> None:
    env = {"PATH": lifecycle.SBIN_PATH, "LC_ALL": "C", "DEB_MAINT_PARAMS": "configure"}
    done = subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise TwinError(f"{' '.join(argv)} in the upgraded twin failed: {done.stderr[-800:]}")
