"""Boards moved by hand (deploys/rebind_board.py) are brought back to the Plan by ONE run of the
main deploy, on a kpro6 twin whose nvidia driver numbers GPUs as the real one does (the first
free minor at each probe: twin/hwsim/views.py). One of CT 200's GPUs goes to vfio-pci and one of
VM 129's boards to nvidia, where it takes the freed minor; the deploy moves both back, gives the
container the nodes its GPUs have after the moves, and the next run changes nothing.
rebind_board refuses to take a board from a running guest that has it, naming the guest."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.e2e.conftest import PYINFRA, ROOT, deploy, inventory, with_driver
from tests.e2e.test_gpu_moves import CT200, VM129, converge, ct_nodes, put, spec
from tests.e2e.test_vfio_binding import drivers
from twin.pytest_plugin import TwinHandle

CT_GPU, VM_GPU = "0000:41:00.0", "0000:c1:00.0"
HOST_GPUS = ("0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0", "0000:81:00.0")
HOST_GPUS += ("0000:a1:00.0",)


def rebind_board(inv: Path, gpu: str, driver: str) -> subprocess.CompletedProcess:
    data = ["--data", f"gpu={gpu}", "--data", f"driver={driver}"]
    return subprocess.run(
        [str(PYINFRA), "-y", str(inv), "deploys/rebind_board.py", *data],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


def live_nodes(twin: TwinHandle) -> list[str]:
    """/dev/nvidiaN of each of CT 200's GPUs, from the driver's own information files."""
    script = "; ".join(
        f"sed -n 's/^Device Minor:[[:space:]]*/\\/dev\\/nvidia/p' "
        f"/proc/driver/nvidia/gpus/{bdf}/information"
        for bdf in HOST_GPUS
    )
    _, out, _ = twin.run(script)
    return sorted(out.split())


def test_one_run_restores_boards_moved_by_hand(fresh, modules, tmp_path: Path) -> None:
    twin = fresh("kpro6")
    with_driver(twin, modules, spec([])["driver"]["version"])
    put(twin, "/etc/pve/lxc/200.conf", CT200)
    put(twin, "/etc/pve/qemu-server/129.conf", VM129)
    env = {"GPUHOST_PVE_TOKEN": (twin.twin.dir / "api-token").read_text().strip()}
    inv = inventory(tmp_path / "kpro6.py", twin, spec(["0000:c1:00.0", "0000:e1:00.0"]))
    converge(twin, inv, env)
    planned = drivers(twin, (CT_GPU, VM_GPU))
    assert planned == {CT_GPU: "nvidia", VM_GPU: "vfio-pci"}
    assert [n for n in ct_nodes(twin) if n[-1].isdigit()] == live_nodes(twin)

    # A running container that has the GPU: the move is refused, naming it.
    assert twin.run("pct start 200")[0] == 0
    held = rebind_board(inv, CT_GPU, "vfio-pci")
    assert held.returncode != 0 and "CT 200" in held.stdout + held.stderr, held.stdout[-3000:]
    assert drivers(twin, (CT_GPU,)) == {CT_GPU: "nvidia"}
    assert twin.run("pct stop 200")[0] == 0

    # By hand, in each direction: the VM's board then takes the minor the GPU left free.
    for gpu, driver in ((CT_GPU, "vfio-pci"), (VM_GPU, "nvidia")):
        moved = rebind_board(inv, gpu, driver)
        assert moved.returncode == 0, (moved.stdout + moved.stderr)[-3000:]
    assert drivers(twin, (CT_GPU, VM_GPU)) == {CT_GPU: "vfio-pci", VM_GPU: "nvidia"}

    once = deploy(inv, env=env)
    assert once.rc == 0, once.output[-5000:]
    twin.reconnect()
    assert drivers(twin, (CT_GPU, VM_GPU)) == planned
    assert [n for n in ct_nodes(twin) if n[-1].isdigit()] == live_nodes(twin), once.output[-3000:]
    again = deploy(inv, env=env)
    assert again.rc == 0 and not again.changed, again.output[-4000:]
