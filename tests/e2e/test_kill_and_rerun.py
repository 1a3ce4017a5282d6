"""A run killed anywhere converges on the next: kill the deploy at three points, run it again,
and the host ends exactly where an uninterrupted run leaves it.

kpro6's command-line and module changes are a trial of the running kernel through its own
entry (deploys/trial_boot.py). The kill points: at the first loader refresh (the running kernel
being pinned); while the trial's own initramfs is built (`mkinitramfs`), before the reboot;
while the run waits for the host to come back from the trial boot; and in the commit, at its
`update-initramfs` of the target kernel, after the gate passed. The twin's tool is made to hang
at that point (a wrapper that signals, then sleeps), and the pyinfra process is killed with
SIGKILL.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpuhost.spec.inventory import load_inventory
from tests.e2e.conftest import PYINFRA, ROOT, deploy, inventory, with_driver
from twin import processes

SPEC = load_inventory(ROOT / "inventory" / "kpro6.py")["kpro6"][0].model_dump(mode="json")
HUNG = "run/gpuhost-test-hung"  # the wrapper touches it when the run reaches the kill point
# kill point -> (tool to hang, the argument it must be called with, or None for any call)
POINTS = {
    "before-loader-refresh": ("usr/sbin/proxmox-boot-tool", "refresh"),
    "before-initramfs": ("usr/sbin/mkinitramfs", None),
    "during-reboot-wait": (None, None),
    "during-commit": ("usr/sbin/update-initramfs", None),
}
AFTER_REBOOT = ("during-commit",)


def hang(root: Path, tool: str, arg: str | None) -> None:
    """Make ``tool`` in the twin signal and sleep (when called with ``arg``) instead of running."""
    path = root / tool
    path.rename(path.with_name(path.name + ".real"))
    when = f'[ "$1" = {arg} ]' if arg else "true"
    path.write_text(
        f"#!/bin/sh\nif {when}; then touch /{HUNG}; echo $$ > /{HUNG}.pid; exec sleep 300; fi\n"
        'exec "$0.real" "$@"\n'
    )
    path.chmod(0o755)


def unhang(root: Path, tool: str) -> None:
    path = root / tool
    path.with_name(path.name + ".real").rename(path)
    pid = root / f"{HUNG}.pid"  # this twin's hung tool only: others' sleeps are not ours
    if pid.exists():
        subprocess.run(["kill", "-9", pid.read_text().strip()], check=False)
        pid.unlink()


def start(inv: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(PYINFRA), "-y", str(inv), "deploys/gpu_host.py"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: SIGKILL takes its SSH helpers too
    )


def kill_when(proc: subprocess.Popen, reached) -> str:
    deadline = time.monotonic() + 120
    while not reached():
        assert proc.poll() is None, f"the run ended before the kill point:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, "the run never reached the kill point"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return proc.stdout.read()


def final_state(root: Path) -> dict[str, object]:
    """What a converged kpro6 twin holds: gpuhost's files, the loader, the initramfs, the boot."""
    state: dict[str, object] = {}
    for pattern in (
        "etc/kernel/cmdline",
        "etc/gpuhost/*",
        "etc/modprobe.d/gpuhost-*",
        "etc/modules-load.d/gpuhost-*",
        "etc/initramfs-tools/hooks/gpuhost-*",
        "etc/systemd/system/gpuhost-*",
        "etc/systemd/system/*.wants/gpuhost-*",
        "usr/local/lib/gpuhost/*",
        "var/lib/gpuhost/*",
    ):
        for path in sorted(root.glob(pattern)):
            data = path.read_bytes() if not path.is_symlink() else str(path.readlink()).encode()
            state[str(path.relative_to(root))] = hashlib.sha256(data).hexdigest()
    for initrd in sorted(root.glob("boot/initrd.img-*")):  # the module configuration it carries
        state[str(initrd.relative_to(root))] = json.loads(initrd.read_text())["sha256"]
    bootcfg = json.loads((root / "var/lib/gpuhost-twin/bootcfg.json").read_text())
    state["loader"] = {k: bootcfg.get(k) for k in ("cmdline", "entries", "kernel_default")}
    state["/proc/cmdline"] = (root / "proc/cmdline").read_text().split()
    uvm = root / "sys/module/nvidia_uvm/parameters/uvm_disable_hmm"
    state["uvm_disable_hmm"] = uvm.read_text().strip() if uvm.exists() else None
    return state


@pytest.fixture(scope="module")
def reference(twin_fleet, modules, tmp_path_factory) -> dict[str, object]:
    """The state an uninterrupted run leaves on a fresh kpro6 twin."""
    (twin,) = twin_fleet.start(1, "kpro6")
    with_driver(twin, modules, SPEC["driver"]["version"])
    run = deploy(inventory(tmp_path_factory.mktemp("ref") / "inv.py", twin, SPEC))
    assert run.rc == 0 and run.reboots == 1, run.output
    state = final_state(twin.root)
    twin_fleet.stop(twin)
    return state


@pytest.mark.parametrize("point", list(POINTS))
def test_killed_run_converges_on_the_next(
    point: str, reference, fresh, modules, tmp_path: Path
) -> None:
    twin = fresh("kpro6")
    with_driver(twin, modules, SPEC["driver"]["version"])
    inv = inventory(tmp_path / "inv.py", twin, SPEC)
    tool, arg = POINTS[point]
    boot_id = twin.boot_id()
    proc = start(inv)
    if tool:
        hang(twin.root, tool, arg)
        output = kill_when(proc, (twin.root / HUNG).exists)
        unhang(twin.root, tool)
        if point in AFTER_REBOOT:  # the trial booted and passed its gate: killed mid-commit
            assert twin.boot_id() != boot_id, output
        else:
            assert twin.boot_id() == boot_id, output  # killed before any reboot
    else:
        output = kill_when(proc, lambda: twin.boot_id() != boot_id)  # the reboot happened
        assert processes.wait_port(twin.address, 22, timeout=30), output  # the host is back
    assert final_state(twin.root) != reference, "the kill left nothing to converge"

    rerun = deploy(inv)
    assert rerun.rc == 0, rerun.output
    assert final_state(twin.root) == reference, rerun.output
    again = deploy(inv)
    assert again.rc == 0 and not again.changed and again.reboots == 0, again.output
