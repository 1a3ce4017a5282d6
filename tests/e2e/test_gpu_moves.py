"""GPUs move between a container and a VM while the host runs, on a kpro6 twin, through the real
pyinfra CLI: two boards go from CT 200 to VM 129 and back, with both guests running, without a
host reboot. The guests whose GPUs change are shut down first (stopall), the entries change
(devN as root, hostpci through PCI mappings and the API token), the boards are rebound, and the
guests start again; each second run changes nothing."""

from __future__ import annotations

import copy
from pathlib import Path

from tests.e2e.conftest import deploy, inventory, with_driver
from tests.e2e.test_boot_slice import KPRO6
from tests.e2e.test_vfio_binding import drivers
from twin.pve.startstop import POWER_LOG
from twin.pytest_plugin import TwinHandle

CT200 = "arch: amd64\nhostname: ct200\nostype: debian\n"
VM129 = "cores: 4\nmachine: q35\nmemory: 8192\nname: vm129\n"
MOVING = ("0000:81:00.0", "0000:a1:00.0")
BOARDS = tuple(b.replace(".0", f".{f}") for b in MOVING for f in (0, 1))


def spec(vm_gpus: list[str]) -> dict:
    moved = copy.deepcopy(KPRO6)
    for guest in moved["guests"]:
        if guest["kind"] == "vm":
            guest["gpus"] = vm_gpus
        else:
            guest["privileged"] = True  # the twin's containers are privileged
    return moved


def put(twin: TwinHandle, path: str, text: str) -> None:
    rc, _, err = twin.run(f"mkdir -p $(dirname {path}) && cat > {path} <<'EOF'\n{text}EOF")
    assert rc == 0, err


def converge(twin: TwinHandle, inv: Path, env: dict[str, str], runs: int = 3) -> str:
    for _ in range(runs):
        done = deploy(inv, env=env)
        assert done.rc == 0, done.output[-5000:]
        twin.reconnect()
        if not done.changed:
            return done.output
    raise AssertionError(f"not converged after {runs} runs:\n{done.output[-3000:]}")


def running(twin: TwinHandle, tool: str, vmid: int) -> bool:
    return twin.run(f"{tool} status {vmid}")[1].strip() == "status: running"


def ct_nodes(twin: TwinHandle) -> list[str]:
    conf = (twin.root / "etc/pve/lxc/200.conf").read_text()
    return sorted(
        line.split(": ", 1)[1].split(",")[0]
        for line in conf.splitlines()
        if line.startswith("dev") and "/dev/nvidia" in line and "[" not in line
    )


def vm_mappings(twin: TwinHandle) -> list[str]:
    conf = (twin.root / "etc/pve/qemu-server/129.conf").read_text()
    return sorted(
        line.split("mapping=", 1)[1].split(",")[0]
        for line in conf.split("\n[")[0].splitlines()
        if line.startswith("hostpci")
    )


def test_two_gpus_move_to_the_vm_and_back_without_a_reboot(fresh, modules, tmp_path: Path) -> None:
    twin = fresh("kpro6")
    with_driver(twin, modules, KPRO6["driver"]["version"])
    put(twin, "/etc/pve/lxc/200.conf", CT200)
    put(twin, "/etc/pve/qemu-server/129.conf", VM129)
    env = {"GPUHOST_PVE_TOKEN": (twin.twin.dir / "api-token").read_text().strip()}
    two = ["0000:c1:00.0", "0000:e1:00.0"]
    inv = inventory(tmp_path / "kpro6.py", twin, spec(two))
    converge(twin, inv, env)
    assert vm_mappings(twin) == ["gpuhost-0000-c1-00", "gpuhost-0000-e1-00"]
    assert len([n for n in ct_nodes(twin) if n[-1].isdigit()]) == 6
    for tool, vmid in (("pct", 200), ("qm", 129)):
        rc, _, err = twin.run(f"{tool} start {vmid}")
        assert rc == 0, err
    assert drivers(twin, BOARDS) == {
        b: "nvidia" if b.endswith(".0") else "snd_hda_intel" for b in BOARDS
    }

    boot_id = twin.boot_id()
    (twin.root / POWER_LOG).parent.mkdir(parents=True, exist_ok=True)
    (twin.root / POWER_LOG).write_text("")
    inv = inventory(tmp_path / "kpro6.py", twin, spec([*two, *MOVING]))
    moved = deploy(inv, env=env)
    assert moved.rc == 0, moved.output[-5000:]
    assert twin.boot_id() == boot_id  # no host reboot
    assert drivers(twin, BOARDS) == dict.fromkeys(BOARDS, "vfio-pci")
    assert vm_mappings(twin) == sorted(
        f"gpuhost-{b[:-2].replace(':', '-')}" for b in [*two, *MOVING]
    )
    assert len([n for n in ct_nodes(twin) if n[-1].isdigit()]) == 4
    assert running(twin, "pct", 200) and running(twin, "qm", 129)
    log = (twin.root / POWER_LOG).read_text().split("\n")
    stops = [line.split()[2:4] for line in log if " stop " in line]
    assert ["lxc", "200"] in stops and ["qemu", "129"] in stops, log
    again = deploy(inv, env=env)
    assert again.rc == 0 and not again.changed, again.output[-3000:]

    inv = inventory(tmp_path / "kpro6.py", twin, spec(two))
    back = deploy(inv, env=env)
    assert back.rc == 0, back.output[-5000:]
    assert twin.boot_id() == boot_id
    assert drivers(twin, BOARDS) == {
        b: "nvidia" if b.endswith(".0") else "snd_hda_intel" for b in BOARDS
    }
    assert vm_mappings(twin) == ["gpuhost-0000-c1-00", "gpuhost-0000-e1-00"]
    assert len([n for n in ct_nodes(twin) if n[-1].isdigit()]) == 6
    assert running(twin, "pct", 200) and running(twin, "qm", 129)
    rc, out, _ = twin.run("pct exec 200 -- sh -c 'ls /dev/nvidia[0-9]*'")
    assert rc == 0 and len(out.split()) == 6, out
    again = deploy(inv, env=env)
    assert again.rc == 0 and not again.changed, again.output[-3000:]
