"""Setting a profile's ``start`` section (twin/profile_start.py) into a new twin: the captured
host's software, so that a rehearsed deploy starts where it would start on the host.

``install(root, profile)`` runs once, in twin/lifecycle.py create, after the factory install
(hardware.install, pve.install, which registers the captured Proxmox package versions itself):

- files and links are written over the factory boot configuration, so the captured
  /etc/kernel/cmdline, /etc/default/grub and its drop-ins, modprobe.d, modules-load.d and
  gpuhost's own files win; a text starting with ``#!`` is made executable (hookscripts, the
  initramfs hook: the capture keeps no modes). pmxcfs's own links (/etc/pve/local, lxc,
  qemu-server) stay the twin's, and /etc/pve/nodes/<captured host>/ is the twin's node; where
  the capture read a whole set of paths (start.exact: a fact's globs), the twin keeps only
  what it read there, besides its loader's own files;
- the initramfs and the loader's entries are made again from those files (the twin assumes the
  host had run update-initramfs and its loader refresh since its last edit), except that the
  entries carry the captured /proc/cmdline when the profile has it: what booted;
- the running kernel boots first (START_KERNEL, read once by kernel_choice), later boots
  follow the loader like any host's;
- the driver is installed for that kernel before the first boot (as twin/driver.py install
  does, without its reboot), so nvidia loads in the first boot and takes the profile's
  nvidia.first_boot_majors; the other captured modules (nvidia_uvm...) are loaded by
  ``first_boot_modules`` right after that boot's units;
- guests' configs go where Proxmox keeps them (pmxcfs: /etc/pve/nodes/<node>/{lxc,qemu-server});
  a container's root is made at its first start, as for `pct create` on a twin; those that ran
  are started by ``first_boot_guests`` after pve-guests' onboot start.

What ran and how it ended is kept in START_STATE; a twin whose START_STATE says done does none
of it again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from twin import hwsim, userspace
from twin.errors import TwinError
from twin.hwsim.kofile import gcc_release, ko_info
from twin.kernel_choice import BOOTCFG, START_KERNEL  # START_KERNEL: read once, at first boot
from twin.modbuild import NVIDIA_MODULES, ModuleCache, install_driver
from twin.profile import Profile
from twin.profile_start import HostStart

START_STATE = "var/lib/gpuhost-twin/start.json"
# pmxcfs makes these links itself, to the node it runs on (pve-cluster src/pmxcfs/pmxcfs.c
# create_symlinks: local, qemu-server, openvz, lxc -> nodes/<nodename>...): never a capture's.
PMXCFS_LINKS = ("/etc/pve/local", "/etc/pve/lxc", "/etc/pve/qemu-server", "/etc/pve/openvz")
TWIN_OWN = ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf")  # the twin's name and address
# MODULE_LICENSE of nvidia.ko (nv-frontend.c): open-gpu-kernel-modules' kernel-open/ "Dual
# MIT/GPL", the proprietary kernel/ "NVIDIA" (what /proc/driver/nvidia/version's flavour follows)
OPEN_LICENSE = "Dual MIT/GPL"
CLOSED_LICENSE = "NVIDIA"


def install(root: Path, profile: Profile, cache: ModuleCache | None = None) -> None:
    """Set profile.start into the twin root (before its first boot); once per twin."""
    start = profile.start
    state_path = Path(root) / START_STATE
    if start is None or state_path.exists():
        return
    root = Path(root)
    kernel = _check(profile, start)
    from twin.pve import config as pve_config  # the Proxmox simulation (node name)

    node = pve_config.node_name(root)
    for path, text in start.files.items():
        where = _where(path, profile.hostname, node)
        if where is not None:
            _write(root, where, text)
    for path, target in start.links.items():
        where = _where(path, profile.hostname, node)
        if where is not None and where not in PMXCFS_LINKS:
            _link(root, where, target)
    _remove_unlisted(root, profile, node)
    _os_release(root, start.os_release)
    for guest in start.guests:
        sub = "lxc" if guest.kind == "lxc" else "qemu-server"
        text = guest.config if guest.config.endswith("\n") else guest.config + "\n"
        _write(root, f"/etc/pve/nodes/{node}/{sub}/{guest.vmid}.conf", text)
    _boot(root, profile, start)
    (root / START_KERNEL).write_text(kernel + "\n")
    if start.driver is not None:
        _driver(root, profile, kernel, start, cache or ModuleCache())
    state = {
        "kernel": kernel,
        "modules": _extra_modules(start),
        "running": [[g.kind, g.vmid] for g in start.guests if g.running],
        "done": False,
        "log": [],
    }
    _save(root, state)


def _check(profile: Profile, start: HostStart) -> str:
    """The kernel to boot first; a clear error for a start section the twin cannot set."""
    versions = [k.version for k in profile.kernels]
    kernel = start.running_kernel or sorted(versions, key=hwsim.version_key)[-1]
    if kernel not in versions:
        raise TwinError(
            f"{profile.name}: start.running_kernel={kernel!r} is not in kernels {versions};"
            " add that kernel to the profile's kernels or fix running_kernel"
        )
    vmids = [g.vmid for g in start.guests]
    if len(set(vmids)) != len(vmids):
        raise TwinError(f"{profile.name}: start.guests lists a vmid twice: {vmids}")
    return kernel


def _where(path: str, hostname: str, node: str) -> str | None:
    """Where a captured path goes in the twin; None for what stays the twin's own."""
    if path in TWIN_OWN:
        return None
    prefix = f"/etc/pve/nodes/{hostname}/"
    return f"/etc/pve/nodes/{node}/{path[len(prefix) :]}" if path.startswith(prefix) else path


def _remove_unlisted(root: Path, profile: Profile, node: str) -> None:
    """Where the capture read everything (start.exact), the twin has only what it read; the
    profile's boot loader keeps the files it is configured by, pmxcfs its links, and the twin's
    API its CA certificate (pve-cluster's pve-root-ca.pem: the twin's own, never a capture's)."""
    start = profile.start
    assert start is not None
    keep = {_where(p, profile.hostname, node) for p in [*start.files, *start.links]}
    keep |= {*PMXCFS_LINKS, "/etc/pve/pve-root-ca.pem"}
    if profile.boot.loader == "grub":
        keep.add("/etc/default/grub")
    elif profile.boot.loader == "systemd-boot":  # loader none: the hypervisor's, no file
        keep.add("/etc/kernel/cmdline")
    if profile.boot.loader == "systemd-boot" or profile.boot.grub_on_esp:
        keep.add("/etc/kernel/proxmox-boot-uuids")
    for pattern in start.exact:
        where = _where(pattern, profile.hostname, node) or pattern
        for path in sorted(root.glob(where.lstrip("/"))):
            if "/" + str(path.relative_to(root)) in keep:
                continue
            if path.is_symlink() or path.is_file():
                path.unlink()


def _write(root: Path, path: str, text: str) -> None:
    dest = root / path.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink():  # e.g. Debian's /etc/os-release -> ../usr/lib/os-release
        dest.unlink()
    dest.write_text(text)
    dest.chmod(0o755 if text.startswith("#!") else 0o644)


def _link(root: Path, path: str, target: str) -> None:
    dest = root / path.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.is_dir():
        shutil.rmtree(dest)
    dest.symlink_to(target)


def _os_release(root: Path, values: dict[str, str]) -> None:
    """os-release(5)'s ID, VERSION_ID and VERSION_CODENAME as captured; the rest as it was."""
    if not values:
        return
    path = root / "etc/os-release"
    text = path.read_text() if path.exists() else ""
    lines = [ln for ln in text.splitlines() if ln.partition("=")[0] not in values]
    lines += [f'{key}="{value}"' for key, value in values.items()]
    _write(root, "/etc/os-release", "\n".join(lines) + "\n")


def _boot(root: Path, profile: Profile, start: HostStart) -> None:
    """The initramfs and the loader's entries again, from the captured files (as the Proxmox
    installer's first ones were made: pve/setup.py); then the captured command line in them."""
    from twin.pve import setup

    for initrd in root.glob("boot/initrd.img-*"):
        initrd.unlink()
    boot = profile.boot
    setup._factory_boot(root, boot, boot.loader, boot.firmware)
    if start.cmdline is None:
        return
    # The loader puts its own word first (systemd-boot initrd=, GRUB BOOT_IMAGE=): the twin's
    # loader adds it again at boot (kernel_choice._full_cmdline).
    words = start.cmdline.split()
    if words and words[0].startswith(("initrd=", "BOOT_IMAGE=")):
        words = words[1:]
    cfg_path = root / BOOTCFG
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    options = " ".join(words)
    cfg["cmdline"] = options
    cfg["entries"] = {k: options for k in cfg.get("entries") or {}}
    cfg_path.parent.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")


def _driver(root: Path, profile: Profile, kver: str, start: HostStart, cache: ModuleCache) -> None:
    """Modules of the captured driver for the kernel that boots, its GSP firmware and its
    userspace: what twin/driver.py install puts into a running twin, before the first boot."""
    assert start.driver is not None
    version = start.driver.version
    license = OPEN_LICENSE if start.driver.open else CLOSED_LICENSE
    loaded = {hwsim.norm(m) for m in start.driver.loaded or []}
    names = [n for n in NVIDIA_MODULES if n in ("nvidia", "nvidia_uvm") or n in loaded]
    kernel = profile.kernel(kver)
    assert kernel is not None
    kos = {
        n: _built_by(cache.ko(n, kver, version=version, license=license), kernel.gcc) for n in names
    }
    install_driver(root, kver, version, kos)
    userspace.install_root(root, version)


def _built_by(ko: Path, gcc: str) -> Path:
    """The module as the kernel's own compiler would have built it. The twin builds with the
    machine's gcc; a captured kernel's may be one it has not (the H200 image: GCC 15.3.0). The
    twin's kernel reads the compiler from the module's .comment (hwsim/modules.py _refuse), so
    a copy carries the kernel's compiler line there, as DKMS's build with that compiler would."""
    want = gcc_release(gcc)
    if want is None or gcc_release(ko_info(ko)["comment"]) == want:
        return ko
    words = gcc.split(None, 1)  # "gcc (GCC) 15.3.0" -> the .comment "GCC: (GCC) 15.3.0"
    comment = "GCC: " + (words[1] if len(words) == 2 else gcc)
    out = ko.with_name(f"{ko.stem}.gcc-{want}.ko")
    if out.exists():
        return out
    note = ko.with_name(f".{ko.stem}.{os.getpid()}.comment")
    tmp = ko.with_name(f".{ko.stem}.{os.getpid()}.ko")
    note.write_bytes(comment.encode() + b"\0")
    subprocess.run(
        ["objcopy", "--remove-section=.comment", f"--add-section=.comment={note}",
         "--set-section-flags=.comment=contents,readonly", str(ko), str(tmp)],
        check=True, capture_output=True,
    )  # fmt: skip
    note.unlink()
    os.replace(tmp, out)
    return out


def _extra_modules(start: HostStart) -> list[str]:
    """Captured modules the boot itself does not load (nvidia loads by its PCI alias)."""
    if start.driver is None or not start.driver.loaded:
        return []
    return [hwsim.norm(m) for m in start.driver.loaded if hwsim.norm(m) != "nvidia"]


def _load(root: Path) -> dict:
    path = root / START_STATE
    return json.loads(path.read_text()) if path.exists() else {"done": True}


def _save(root: Path, state: dict) -> None:
    path = root / START_STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.rename(path)


def first_boot_modules(root: Path) -> None:
    """Load the captured modules the first boot did not: nvidia_uvm as CUDA has it loaded
    (nvidia-modprobe -u -c=0, which also makes /dev/nvidia-uvm*), the others with modprobe."""
    state = _load(root)
    if state.get("done") or state.get("modules_done"):
        return
    from twin import units

    for name in state.get("modules", []):
        command = "nvidia-modprobe -u -c=0" if name == "nvidia_uvm" else f"modprobe {name}"
        run = subprocess.run(
            ["chroot", str(root), "/bin/sh", "-c", command],
            env=units.ENV, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
        )  # fmt: skip
        state["log"].append(f"{command}: exit status {run.returncode} {run.stderr.strip()}".strip())
    state["modules_done"] = True
    _save(root, state)


def first_boot_guests(twin: object) -> None:
    """Start the captured running guests that pve-guests did not start (no onboot), each as a
    task like startall's; a guest that cannot start is recorded, not fatal."""
    from twin import guests
    from twin.pve import guest_state, runtime, tasks

    root: Path = twin.root  # type: ignore[attr-defined]
    state = _load(root)
    if state.get("done"):
        return
    for kind, vmid in state.get("running", []):
        if guest_state.is_running(root, kind, vmid):
            continue

        def work(w: tasks.Worker, kind: str = kind, vmid: int = vmid) -> None:
            if kind == "qemu":
                runtime.start_qemu(root, vmid, warn=w.warn, hook_log=w.log)
                return
            result = runtime.start_lxc(
                root, vmid, log=w.log, warn=w.warn, start=lambda: guests.start(twin, vmid)
            )
            if result["rc"] != 0:
                raise RuntimeError(str(result["stderr"]) or f"start of CT {vmid} failed")

        # the captured guest may not start on the twin (a device it names is missing): say why
        error = tasks.run_sync(root, "vzstart" if kind == "lxc" else "qmstart", vmid, work)
        state["log"].append(f"{kind} {vmid}: " + (f"not started: {error}" if error else "started"))
    state["done"] = True
    state["done_at"] = time.time()
    _save(root, state)


def report(root: Path) -> list[str]:
    """What the first boot did with the start section (for rehearse's output and tests)."""
    return list(_load(Path(root)).get("log", []))
