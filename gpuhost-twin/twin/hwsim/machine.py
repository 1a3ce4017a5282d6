"""The simulated machine's state under one root: the profile, the live state file, the kernel
log, the kernels it has; the lock that serialises changes, and small helpers the views share.

Every path is under a root prefix (the shims take it from $TWIN_ROOT, default "/")."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from .catalog import BRIDGE_DRIVER
from .kofile import norm

PROFILE = "etc/gpuhost-twin/profile.json"
STATE = "var/lib/gpuhost-twin/hw.json"
DMESG = "var/log/twin-dmesg"


class Machine:
    """The simulated machine under one root; load state, change it, save it."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root if root is not None else os.environ.get("TWIN_ROOT", "/"))
        self.profile: dict = json.loads(self.p(PROFILE).read_text())
        path = self.p(STATE)
        self.state: dict = json.loads(path.read_text()) if path.exists() else {}

    def p(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        target = self.p(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with _writable(target.parent):
            tmp = target.with_name(f".{target.name}.tmp")
            tmp.write_text(text)
            os.chmod(tmp, mode)
            os.replace(tmp, target)

    def save(self) -> None:
        self.write(STATE, json.dumps(self.state, indent=1, sort_keys=True) + "\n")

    def klog(self, message: str) -> None:
        """Append a kernel log line, stamped with simulated seconds since boot."""
        t = max(time.time() - self.state.get("booted_at", time.time()), 0.0) if self.state else 0.0
        if self.state.get("boot_done"):  # at runtime: seconds since the simulated power-on
            t += self.state.get("uptime_at_boot", 0.0)
        line = f"[{t:12.6f}] {message}"
        self.state.setdefault("dmesg", []).append(line)
        target = self.p(DMESG)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as f:
            f.write(line + "\n")

    @property
    def kernel(self) -> str:
        return self.state.get("kernel", "")

    def devices(self) -> dict[str, dict]:
        return {d["bdf"]: d for d in self.profile["pci_devices"]}

    def gpus(self) -> list[dict]:
        return self.profile["gpus"]

    def modules(self) -> dict[str, dict]:
        return self.state.setdefault("modules", {})

    def loaded(self, name: str) -> bool:
        return norm(name) in self.modules()

    def device_modules(self) -> dict[str, str]:
        """{module: the driver it binds as} of the profile's devices: the device's first
        "Kernel modules" entry (xhci_pci binds as xhci_hcd), else its driver's name."""
        found: dict[str, str] = {}
        for d in self.profile["pci_devices"]:
            driver = d.get("driver")
            if driver and driver != BRIDGE_DRIVER:
                found.setdefault(norm((d.get("modules") or [driver])[0]), driver)
        return found

    def builtin(self, name: str) -> bool:
        """Whether the booted kernel has the module built in: its modules.builtin lists it
        (a Proxmox kernel builds xhci_pci as a module: pve-kernel debian/rules,
        ``-m CONFIG_USB_XHCI_PCI``; a kernel built from another config may not)."""
        path = self.p(f"lib/modules/{self.kernel}/modules.builtin")
        lines = path.read_text().split() if self.kernel and path.is_file() else []
        return norm(name) in {norm(Path(line).name.split(".", 1)[0]) for line in lines}

    def kernel_info(self, version: str) -> dict:
        """How a kernel was built: profile entry, else /boot/config-<ver> (CONFIG_CC_VERSION_TEXT)."""
        for k in self.profile["kernels"]:
            if k["version"] == version:
                info = dict(k)
                break
        else:
            info = {
                "version": version,
                "gcc": "",
                "ld": "GNU ld (GNU Binutils for Debian) 2.40",
                "builder": "build@proxmox",
                "build": None,
            }
            record = self.p(f"lib/modules/{version}/twin-kernel.json")
            config = self.p(f"boot/config-{version}")
            if record.exists():  # written by hardware.add_kernel for kernels added later
                info.update(json.loads(record.read_text()))
            elif config.exists():  # a real kernel package's (make bindeb-pkg)
                text = config.read_text()
                m = re.search(r'^CONFIG_CC_VERSION_TEXT="(.*)"$', text, re.M)
                info["gcc"] = m.group(1) if m else ""
                info["vermagic"] = config_vermagic(version, text)
        if not info.get("build"):
            stamp = re.sub(r"-pve$", "", version)
            info["build"] = f"#1 SMP PREEMPT_DYNAMIC PMX {stamp} (2025-03-16T19:18Z)"
        info.setdefault("vermagic", f"{version} SMP preempt mod_unload modversions")
        return info

    def installed_kernels(self) -> list[str]:
        boot = self.p("boot")
        found = [f.name[len("vmlinuz-") :] for f in boot.glob("vmlinuz-*")] if boot.is_dir() else []
        return sorted(found, key=version_key)


def config_vermagic(release: str, config: str) -> str:
    """The vermagic a kernel of this .config gives its modules (include/linux/vermagic.h:
    UTS_RELEASE, then "SMP ", "preempt "/"preempt_rt ", "mod_unload ", "modversions ").

    "preempt " follows CONFIG_PREEMPT_BUILD, not CONFIG_PREEMPT (vermagic.h L18 in Debian's 6.1
    headers): PREEMPT_DYNAMIC kernels (Debian's, Proxmox's) say "preempt" with PREEMPT unset."""
    on = set(re.findall(r"^(CONFIG_[A-Z0-9_]+)=y$", config, re.M))
    words = [release]
    words += ["SMP"] if "CONFIG_SMP" in on else []
    if "CONFIG_PREEMPT_BUILD" in on:
        words.append("preempt")
    elif "CONFIG_PREEMPT_RT" in on:
        words.append("preempt_rt")
    words += ["mod_unload"] if "CONFIG_MODULE_UNLOAD" in on else []
    words += ["modversions"] if "CONFIG_MODVERSIONS" in on else []
    return " ".join(words)


@contextlib.contextmanager
def locked(root: str | Path | None = None) -> Iterator[IO[str]]:
    """Serialise state changes (two SSH sessions may run modprobe at once). Yields the lock
    file, so a holder can let go of it while it waits for a command that takes it too."""
    base = Path(root if root is not None else os.environ.get("TWIN_ROOT", "/"))
    lock = base / "var/lib/gpuhost-twin/hw.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _writable(directory: Path):
    """The kernel writes its own read-only procfs dirs (dr-xr-xr-x): root does so anyway; a
    non-root owner of a test root opens the directory for the write and closes it again."""
    if os.geteuid() == 0 or os.access(directory, os.W_OK):
        yield
        return
    mode = directory.stat().st_mode & 0o7777
    os.chmod(directory, mode | 0o200)
    try:
        yield
    finally:
        os.chmod(directory, mode)


def remove_tree(path: Path) -> None:
    """Remove a simulated kernel tree, read-only dirs included (see :func:`_writable`)."""
    if os.geteuid() != 0 and path.is_dir():
        for sub in [path, *(p for p in path.rglob("*") if p.is_dir() and not p.is_symlink())]:
            os.chmod(sub, (sub.stat().st_mode & 0o7777) | 0o700)
    import shutil  # here: the shims that only read never pay for it

    shutil.rmtree(path, ignore_errors=True)


def mknod(path: Path, major: int, minor: int, mode: int) -> None:
    if path.exists() or path.is_symlink():
        st = path.lstat()
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor):
            os.chmod(path, mode)
            return
        path.unlink()
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # umask-proof


def version_key(version: str) -> tuple:
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.-]", version))


def new_boot_id() -> str:
    import uuid  # here: uuid imports platform and random, ~4 ms of every shim

    return str(uuid.uuid4())


def gpu_uuid(gpu: dict) -> str:
    if gpu.get("uuid"):
        return gpu["uuid"]
    import hashlib

    h = hashlib.sha256(gpu["uuid_seed"].encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def refresh_uptime(root: str | Path) -> None:
    """Rewrite /proc/uptime from the boot time; the plumbing calls this so uptime keeps growing."""
    hw = Machine(root)
    up = time.time() - hw.state["booted_at"] + hw.state.get("uptime_at_boot", 0.0)
    hw.write("proc/uptime", f"{up:.2f} {up * 0.9 * hw.profile['cpu']['cpus']:.2f}\n", 0o444)
