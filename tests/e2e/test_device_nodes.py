"""Device nodes on a real boot path: the nvidia driver makes none; gpuhost's boot unit does.

On a kpro6 twin with the driver installed, a boot leaves /dev without NVIDIA nodes, so a
container whose config binds them (devN) fails to start with Proxmox's message. After gpuhost's
deploy (and the reboot it does), the enabled oneshot unit ran at boot through nvidia-modprobe:
every node exists with this boot's majors from /proc/devices, and the container starts.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import deploy, inventory, with_driver
from tests.e2e.test_boot_slice import KPRO6
from twin.pytest_plugin import PVE_DIRS

UNIT = "gpuhost-nvidia-devices.service"
NODES = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
CONF = "arch: amd64\nhostname: nodes\n" + "".join(f"dev{i}: {n}\n" for i, n in enumerate(NODES))
CTID = 250


def _start(twin) -> tuple[int, str]:
    rc, _, err = twin.request(f'{{"op": "ct-start", "ctid": {CTID}}}')
    return rc, err


def test_nodes_come_from_the_boot_unit(fresh, modules, tmp_path: Path) -> None:
    twin = fresh("kpro6")
    with_driver(twin, modules, KPRO6["driver"]["version"])
    assert twin.run("test -d /proc/driver/nvidia/gpus")[0] == 0  # the driver is loaded
    assert twin.run("ls /dev/nvidia* /dev/nvidia-caps")[0] != 0  # and made no node
    twin.run(f"{PVE_DIRS}; cat > /etc/pve/lxc/{CTID}.conf <<'EOF'\n{CONF}EOF")
    assert _start(twin) == (255, "Device /dev/nvidia0 does not exist\n")

    result = deploy(inventory(tmp_path / "inv.py", twin, KPRO6))
    assert result.rc == 0, result.output
    assert result.reboots == 1, result.output
    twin.reconnect()
    assert twin.run(f"test -L /etc/systemd/system/multi-user.target.wants/{UNIT}")[0] == 0
    assert twin.run(f"systemctl is-active {UNIT}")[1] == "active\n"
    majors = {}
    for line in twin.run("cat /proc/devices")[1].split("\n\n")[0].splitlines()[1:]:
        major, name = line.split()
        majors[name] = int(major)
    rc, out, err = twin.run("stat -c '%n %F %t %T' " + " ".join(NODES))
    assert rc == 0, err
    got = {n: (kind, int(ma, 16), int(mi, 16)) for n, kind, ma, mi in _stat_rows(out)}
    assert got == {
        "/dev/nvidia0": ("character special file", 195, 0),
        "/dev/nvidiactl": ("character special file", 195, 255),
        "/dev/nvidia-uvm": ("character special file", majors["nvidia-uvm"], 0),
        "/dev/nvidia-uvm-tools": ("character special file", majors["nvidia-uvm"], 1),
    }
    rc, out, _ = twin.run(
        "stat -c '%n %t %T' /dev/nvidia-caps/nvidia-cap1 /dev/nvidia-caps/nvidia-cap2"
    )
    assert rc == 0 and {int(row.split()[1], 16) for row in out.splitlines()} == {
        majors["nvidia-caps"]
    }
    assert _start(twin) == (0, "")
    twin.request(f'{{"op": "ct-stop", "ctid": {CTID}}}')


def _stat_rows(out: str) -> list[tuple[str, str, str, str]]:
    rows = []
    for line in out.splitlines():
        name, rest = line.split(" ", 1)
        kind, major, minor = rest.rsplit(" ", 2)
        rows.append((name, kind, major, minor))
    return rows
