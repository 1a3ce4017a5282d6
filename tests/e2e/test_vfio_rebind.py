"""Moving a board between nvidia and vfio-pci without a reboot, on a deployed kpro6 twin.

Through the real pyinfra CLI (deploys/rebind_board.py): refused, naming the process, while a
process holds the GPU's /dev/nvidiaN; with only nvidia-persistenced holding it (the twin's
stand-in daemon holds every GPU's node) the daemon lets go of that one GPU (nvidia-smi -i -pm
0), the board (GPU and audio function) moves to vfio-pci, then back to nvidia with its node
made again; the boot count never changes. The twin's kernel side: an unbind written while a
process holds the GPU does not complete until the process lets go (nv_pci_remove waits).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.e2e.conftest import PYINFRA, ROOT, deploy, inventory, with_driver
from tests.e2e.test_boot_slice import KPRO6
from tests.e2e.test_vfio_binding import drivers
from twin.nvinstaller import PERSISTENCED
from twin.pytest_plugin import TwinHandle

BOARD = ("0000:a1:00.0", "0000:a1:00.1")  # a host GPU: minor 5, the last on nvidia
NODE = "/dev/nvidia5"


def move(inv: Path, gpu: str, driver: str) -> tuple[int, str]:
    run = subprocess.run(
        [
            str(PYINFRA),
            "-y",
            str(inv),
            "deploys/rebind_board.py",
            *("--data", f"gpu={gpu}"),
            "--data",
            f"driver={driver}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return run.returncode, run.stdout + run.stderr


def hold(twin: TwinHandle, node: str) -> int:
    """A process in the twin that keeps ``node`` open; returns once the twin's /proc lists it.

    The machine has no nvidia driver, so open() of the node fails (ENXIO); an O_PATH descriptor
    shows in /proc/<pid>/fd with the node's device number just as a real open one does."""
    script = f'import os, time; fd = os.open("{node}", os.O_PATH); time.sleep(600)'
    rc, out, err = twin.run(f"setsid python3 -c '{script}' > /dev/null 2>&1 & echo $!")
    assert rc == 0, err
    pid = int(out)
    for _ in range(50):
        if twin.run(f"test -e /proc/{pid}/fd/0")[0] == 0:
            return pid
        time.sleep(0.1)
    raise AssertionError(f"pid {pid} never showed in the twin's /proc")


def smi_bus_ids(twin: TwinHandle) -> list[str]:
    _, out, _ = twin.run("nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader")
    return [line[-12:].lower() for line in out.split()]


@pytest.fixture(scope="module")
def deployed(twin_fleet, modules, tmp_path_factory):
    (twin,) = twin_fleet.start(1, "kpro6")
    try:
        with_driver(twin, modules, KPRO6["driver"]["version"])
        inv = inventory(tmp_path_factory.mktemp("rebind") / "inv.py", twin, KPRO6)
        first = deploy(inv)
        assert first.rc == 0, first.output[-4000:]
        twin.reconnect()
        yield twin, inv
    finally:
        twin_fleet.stop(twin)


def test_a_board_moves_to_vfio_pci_and_back_without_a_reboot(deployed) -> None:
    twin, inv = deployed
    boot_id = twin.boot_id()
    assert drivers(twin, BOARD) == {BOARD[0]: "nvidia", BOARD[1]: "snd_hda_intel"}

    pid = hold(twin, NODE)
    rc, out = move(inv, BOARD[0], "vfio-pci")
    assert rc != 0
    assert f"GPU {BOARD[0]} is in use by pid {pid} (python3)" in out, out[-3000:]
    assert drivers(twin, BOARD) == {BOARD[0]: "nvidia", BOARD[1]: "snd_hda_intel"}
    twin.run(f"kill {pid}")

    # nvidia-persistenced holds every GPU; it is asked to let go of this one only
    rc, _, err = twin.run(
        f"cat > /usr/bin/nvidia-persistenced <<'EOF'\n{PERSISTENCED}EOF\n"
        "chmod 755 /usr/bin/nvidia-persistenced && /usr/bin/nvidia-persistenced"
    )
    assert rc == 0, err
    time.sleep(1)
    _, held, _ = twin.run("cat /run/nvidia-persistenced/held.json")
    assert json.loads(held) == [0, 1, 2, 3, 4, 5]
    _, pm, _ = twin.run(
        f"nvidia-smi -i {BOARD[0]} --query-gpu=persistence_mode --format=csv,noheader"
    )
    assert pm.strip() == "Enabled"

    rc, out = move(inv, BOARD[0], "vfio-pci")
    assert rc == 0, out[-3000:]
    assert drivers(twin, BOARD) == dict.fromkeys(BOARD, "vfio-pci")
    _, held, _ = twin.run("cat /run/nvidia-persistenced/held.json")
    assert json.loads(held) == [0, 1, 2, 3, 4]  # the other GPUs keep their persistence
    assert BOARD[0] not in smi_bus_ids(twin) and len(smi_bus_ids(twin)) == 5
    rc, out = move(inv, BOARD[0], "vfio-pci")
    assert rc == 0 and "No changes" in out, out[-3000:]  # already there: nothing to do

    rc, out = move(inv, BOARD[0], "nvidia")
    assert rc == 0, out[-3000:]
    assert drivers(twin, BOARD) == {BOARD[0]: "nvidia", BOARD[1]: "snd_hda_intel"}
    assert twin.run(f"test -c {NODE}")[0] == 0  # made again by nvidia-modprobe
    assert BOARD[0] in smi_bus_ids(twin) and len(smi_bus_ids(twin)) == 6
    assert twin.boot_id() == boot_id
    # back in persistence mode, as the host's other GPUs are: the daemon holds it again
    _, held, _ = twin.run("cat /run/nvidia-persistenced/held.json")
    assert sorted(json.loads(held)) == [0, 1, 2, 3, 4, 5]
    _, pm, _ = twin.run(
        f"nvidia-smi -i {BOARD[0]} --query-gpu=persistence_mode --format=csv,noheader"
    )
    assert pm.strip() == "Enabled"
    twin.run("kill $(cat /run/nvidia-persistenced/nvidia-persistenced.pid)")


def test_an_unbind_waits_while_a_process_holds_the_gpu(deployed) -> None:
    """The twin's kernel: nv_pci_remove does not fail on a held GPU, it waits for its users."""
    twin, _ = deployed
    gpu = "0000:81:00.0"  # minor 4
    pid = hold(twin, "/dev/nvidia4")
    twin.run(f"echo {gpu} > /sys/bus/pci/drivers/nvidia/unbind")
    time.sleep(1.5)
    assert drivers(twin, (gpu,)) == {gpu: "nvidia"}
    _, log, _ = twin.run("dmesg")
    assert f"NVRM: Attempting to remove device {gpu} with non-zero usage count!" in log
    twin.run(f"kill {pid}")
    for _ in range(40):
        if drivers(twin, (gpu,)) == {gpu: ""}:
            break
        time.sleep(0.1)
    assert drivers(twin, (gpu,)) == {gpu: ""}  # released: the remove went through
    twin.run(f"echo {gpu} > /sys/bus/pci/drivers_probe")
    time.sleep(0.5)
    assert drivers(twin, (gpu,)) == {gpu: "nvidia"}


PIDFILE = "/run/nvidia-persistenced/nvidia-persistenced.pid"


def daemon_table(twin: TwinHandle) -> list[str]:
    _, out, _ = twin.run("cat /run/nvidia-persistenced/devices.json")
    return json.loads(out)


def test_a_daemon_that_started_without_the_gpu_is_restarted_for_it(deployed) -> None:
    """nvidia-persistenced builds its table at start: a GPU then on vfio-pci is unknown to it,
    and `nvidia-smi -pm 1` fails for it until the daemon restarts (twin/nvinstaller.py). The
    move back resets each function first, while vfio-pci still has it (board a1 lists FLR)."""
    from gpuhost.plan.driver.userspace import PERSISTENCED_UNIT, persistenced_unit
    from twin import hwsim

    twin, inv = deployed
    unit = persistenced_unit(SimpleNamespace(version=KPRO6["driver"]["version"]))  # type: ignore[arg-type]
    rc, _, err = twin.run(
        f"cat > /usr/bin/nvidia-persistenced <<'EOF'\n{PERSISTENCED}EOF\n"
        f"chmod 755 /usr/bin/nvidia-persistenced && cat > {PERSISTENCED_UNIT} <<'EOF'\n{unit}EOF\n"
    )
    assert rc == 0, err
    rc, out = move(inv, BOARD[0], "vfio-pci")
    assert rc == 0, out[-3000:]
    rc, _, err = twin.run(f"systemctl start {PERSISTENCED_UNIT.rsplit('/', 1)[1]}")
    assert rc == 0, err
    assert BOARD[0] not in daemon_table(twin) and len(daemon_table(twin)) == 5
    daemon = twin.run(f"cat {PIDFILE}")[1].strip()

    rc, out = move(inv, BOARD[0], "nvidia")
    assert rc == 0, out[-3000:]
    assert drivers(twin, BOARD) == {BOARD[0]: "nvidia", BOARD[1]: "snd_hda_intel"}
    _, pid, _ = twin.run(f"cat {PIDFILE}")
    assert pid.strip() != daemon  # restarted through its unit
    assert BOARD[0] in daemon_table(twin)  # the restarted daemon knows it
    _, held, _ = twin.run("cat /run/nvidia-persistenced/held.json")
    assert sorted(json.loads(held)) == [0, 1, 2, 3, 4, 5]
    resets = hwsim.Hw(twin.root).state.get("resets", [])
    assert [BOARD[0], "vfio-pci"] in resets and [BOARD[1], "vfio-pci"] in resets
    twin.run(f"systemctl stop {PERSISTENCED_UNIT.rsplit('/', 1)[1]}")


def test_a_function_that_does_not_answer_keeps_the_board_on_vfio_pci(deployed) -> None:
    """Config space reads back all ones (the twin's fault: the function fell off the bus): the
    move back is refused and the board stays where it was. Last: the board is gone for good."""
    from twin import hwsim

    twin, inv = deployed
    rc, out = move(inv, BOARD[0], "vfio-pci")
    assert rc == 0, out[-3000:]
    with hwsim.locked(twin.root):
        hw = hwsim.Hw(twin.root)
        hw.fall_off_bus(BOARD[1])
        hw.save()
    rc, out = move(inv, BOARD[0], "nvidia")
    assert rc != 0
    assert f"{BOARD[1]}: config space reads back ffff" in out, out[-3000:]
    assert drivers(twin, BOARD) == dict.fromkeys(BOARD, "vfio-pci")
