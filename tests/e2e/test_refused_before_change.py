"""A run refuses before its first change when something it needs from the control machine is
missing, on a kpro6 twin whose guests run: the deploy that would stop the guests and move two
boards to the VM finds, while planning, that its API token file cannot be read. Nothing is
stopped, no board moves, no file changes, and `gpuhost plan` shows the failed precondition."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import ROOT, deploy, inventory, manifest, with_driver
from tests.e2e.test_gpu_moves import (
    BOARDS,
    CT200,
    MOVING,
    VM129,
    converge,
    put,
    running,
    spec,
)
from tests.e2e.test_vfio_binding import drivers

GPUHOST = Path(sys.executable).parent / "gpuhost"


def test_unreadable_token_is_refused_before_any_change(fresh, modules, tmp_path: Path) -> None:
    twin = fresh("kpro6")
    with_driver(twin, modules, spec([])["driver"]["version"])
    put(twin, "/etc/pve/lxc/200.conf", CT200)
    put(twin, "/etc/pve/qemu-server/129.conf", VM129)
    env = {"GPUHOST_PVE_TOKEN": (twin.twin.dir / "api-token").read_text().strip()}
    two = ["0000:c1:00.0", "0000:e1:00.0"]
    converge(twin, inventory(tmp_path / "kpro6.py", twin, spec(two)), env)
    for tool, vmid in (("pct", 200), ("qm", 129)):
        rc, _, err = twin.run(f"{tool} start {vmid}")
        assert rc == 0, err

    # The user names a token file that is not there (a typo, a file not copied yet).
    moved = copy.deepcopy(spec([*two, *MOVING]))
    moved["proxmox"] = {"token_file": str(tmp_path / "pve-token")}
    inv = inventory(tmp_path / "kpro6.py", twin, moved)
    boards, files, boot_id = drivers(twin, BOARDS), manifest(twin.root), twin.boot_id()
    refused = deploy(inv, env=env)  # the environment's token is not the one the spec names
    assert refused.rc != 0, refused.output[-3000:]
    assert running(twin, "pct", 200) and running(twin, "qm", 129), refused.output[-3000:]
    assert drivers(twin, BOARDS) == boards and twin.boot_id() == boot_id
    assert manifest(twin.root) == files
    assert "nothing was changed" in refused.output, refused.output[-3000:]
    assert f"proxmox.token_file {tmp_path / 'pve-token'} cannot be read" in refused.output
    assert env["GPUHOST_PVE_TOKEN"].split("=", 1)[1] not in refused.output

    shown = subprocess.run(
        [str(GPUHOST), "plan", str(inv)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert shown.returncode == 0, shown.stderr
    assert "FAILED      proxmox.token_file (needed to write through the Proxmox API" in (
        shown.stdout
    ), shown.stdout
