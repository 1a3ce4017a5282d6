"""Temp-dir twins for the Proxmox-layer tests (no root mounts, no sshd, no supervisor)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from twin import pve
from twin.pve import cli

FIXTURES = Path(__file__).parent.parent / "fixtures" / "proxmox" / "configs"
KERNELS = ("6.8.12-9-pve", "6.14.8-2-bpo12-pve")


def profile(loader: str = "systemd-boot", **boot: object) -> SimpleNamespace:
    """Just the fields twin.pve.install reads from a hardware profile."""
    defaults: dict[str, object] = {
        "loader": loader,
        "firmware": "uefi" if loader == "systemd-boot" else "bios",
        "kernel_cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet",
        "esp_uuids": ["9B1C-4F2A"],
        "default_grub": None,
    }
    defaults.update(boot)
    return SimpleNamespace(hostname="kpro6", boot=SimpleNamespace(**defaults))


def make_root(tmp: Path, loader: str = "systemd-boot", kernels: tuple[str, ...] = KERNELS) -> Path:
    """A twin root with kernels in /boot and the Proxmox layer installed."""
    root = tmp / "root"
    (root / "boot").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc/hostname").write_text("pve1\n")
    for version in kernels:
        (root / f"boot/vmlinuz-{version}").write_text("kernel\n")
    pve.install(root, profile(loader))
    return root


def make_hw_root(tmp: Path, profile_name: str = "kpro6") -> Path:
    """A twin root with simulated hardware, booted once (no nvidia module: the GPUs have no
    driver), and the Proxmox layer installed; the node is named after the profile's host."""
    from twin import hwtesting as ht
    from twin.profile import load_profile

    root = tmp / "hwroot"
    ht.make_root(root, profile_name)
    ht.boot_root(root, profile_name)
    pve.install(root, load_profile(profile_name))
    return root


def run(root: Path, tool: str, *args: str) -> tuple[int, str, str]:
    """A tool in-process (fast); see run_shim for the installed script."""
    return cli.run(tool, list(args), root)


def run_shim(root: Path, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The shim install() wrote into the root, as its own process (TWIN_ROOT = root)."""
    where = pve.SHIMS[tool]
    env = dict(os.environ, TWIN_ROOT=str(root))
    return subprocess.run(
        [sys.executable, str(root / where / tool), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def run_hook(root: Path, phase: str, name: str, version: str) -> subprocess.CompletedProcess[str]:
    """One /etc/kernel/<phase>.d hook, as a kernel package's run-parts calls it."""
    env = dict(os.environ, TWIN_ROOT=str(root))
    hook = root / "etc/kernel" / f"{phase}.d" / name
    return subprocess.run(
        [sys.executable, str(hook), version, f"/boot/vmlinuz-{version}"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def write_conf(root: Path, kind: str, vmid: int, text: str) -> Path:
    sub = "lxc" if kind == "lxc" else "qemu-server"
    path = root / "etc/pve" / sub / f"{vmid}.conf"
    path.write_text(text)
    return path


def fake_node(root: Path, path: str, char: bool = True) -> None:
    """A device node in the twin's /dev (a regular file when mknod is not allowed)."""
    node = root / path.lstrip("/")
    node.parent.mkdir(parents=True, exist_ok=True)
    if char:
        os.mknod(node, 0o600 | 0o020000, os.makedev(195, 0))
    else:
        node.write_text("")


class FakeSupervisor:
    """Answers the twin's request files like twin/supervisor.py (ct-start/ct-stop/ct-exec)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests = root / "run/gpuhost-twin/requests"
        self.requests.mkdir(parents=True, exist_ok=True)
        self.seen: list[dict[str, object]] = []
        self.stop = threading.Event()
        self.fail_start = ""
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            for req in sorted(self.requests.glob("*.json")):
                data = json.loads(req.read_text())
                req.unlink()
                self.seen.append(data)
                answer = self._answer(data)
                req.with_suffix(".done").write_text(json.dumps(answer))
            time.sleep(0.01)

    def _answer(self, req: dict[str, object]) -> dict[str, object]:
        ctid = req["ctid"]
        state = self.root / "run/gpuhost-twin/ct" / f"{ctid}.json"
        if req["op"] == "ct-start":
            if self.fail_start:
                return {"rc": 255, "stdout": "", "stderr": self.fail_start}
            state.parent.mkdir(parents=True, exist_ok=True)
            state.write_text(json.dumps({"status": "running"}))
        elif req["op"] == "ct-stop":
            state.unlink()
        elif req["op"] == "ct-exec":
            argv = req["argv"]
            return {"rc": 3, "stdout": "ran " + " ".join(argv), "stderr": ""}  # type: ignore[arg-type]
        return {"rc": 0, "stdout": "", "stderr": ""}

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
