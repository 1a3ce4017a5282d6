"""Guests as inventory: a twin's containers and VMs, listed through proxmoxer (pvesh as root over
SSH with the host key verified, gpuhost/pve/ssh.py), become pyinfra hosts named after the guests;
a host whose key the inventory's known_hosts lacks is refused."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import InventoryError

from gpuhost.pve.guests import GUEST_KEY, guests_of
from gpuhost.spec.inventory import load_inventory
from tests.e2e.conftest import PYINFRA, ROOT, inventory
from twin.pytest_plugin import TwinHandle

SPEC = load_inventory(ROOT / "inventory/kpro6.py")["kpro6"][0].model_dump(mode="json")
CT200 = "arch: amd64\nhostname: ct200\nostype: debian\n"
VM129 = "machine: q35\nname: vm129\nipconfig0: ip=10.1.2.9/24,gw=10.1.2.1\n"
VM140 = "name: scratch\n"  # a guest the spec does not name


def put(twin: TwinHandle, path: str, text: str) -> None:
    rc, _, err = twin.run(f"mkdir -p $(dirname {path}) && cat > {path} <<'EOF'\n{text}EOF")
    assert rc == 0, err


def test_a_nodes_guests_become_hosts_with_their_spec(fresh, tmp_path: Path) -> None:
    twin = fresh("kpro6")
    spec = {**SPEC}
    spec["guests"] = [
        {**g, "access": {"ssh_hostname": twin.twin.guest_address(200)}} if g["kind"] == "lxc" else g
        for g in SPEC["guests"]
    ]
    inv = inventory(tmp_path / "kpro6.py", twin, spec)
    (entry,) = [(n, d) for n, (s, d) in load_inventory(inv).items()]
    host_data = {**entry[1], "gpuhost": load_inventory(inv)[twin.name][0]}
    put(twin, "/etc/pve/lxc/200.conf", CT200)
    stranger = tmp_path / "known_hosts.other"  # a key for the address, but not this host's
    stranger.write_text(
        f"{twin.address} ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIB5Yp6rVj0sJ1mC4m7qN3bVfR8c2kH0xLq9W1sT6uE4a\n"
    )
    with pytest.raises(InventoryError, match=r"cannot list its guests over SSH \(BadHostKeyExc"):
        guests_of((twin.name, {**host_data, "ssh_known_hosts_file": str(stranger)}))
    stranger.write_text("")  # no key at all
    with pytest.raises(InventoryError, match=r"cannot list its guests over SSH \(SSHException"):
        guests_of((twin.name, {**host_data, "ssh_known_hosts_file": str(stranger)}))
    with pytest.raises(
        InventoryError, match=r"names guests the node does not have: qemu 129 \(vm129\)"
    ):
        guests_of((twin.name, host_data))
    put(twin, "/etc/pve/qemu-server/129.conf", VM129)
    put(twin, "/etc/pve/qemu-server/140.conf", VM140)
    hosts = dict(guests_of((twin.name, host_data)))
    assert sorted(hosts) == ["ct200", "scratch", "vm129"]
    ct200, vm129, scratch = (hosts[n][GUEST_KEY] for n in ("ct200", "vm129", "scratch"))
    assert (ct200.kind, ct200.vmid, ct200.spec.name) == ("lxc", 200, "ct200")
    assert hosts["ct200"]["ssh_hostname"] == twin.twin.guest_address(200)
    assert (vm129.kind, vm129.vmid, vm129.status) == ("qemu", 129, "stopped")
    assert hosts["vm129"]["ssh_hostname"] == "10.1.2.9"  # its cloud-init static address
    assert scratch.spec is None and hosts["scratch"]["ssh_hostname"] == "scratch"

    # the CLI addresses the container by name: --limit ct200 runs on the guest alone
    inv.write_text(
        inv.read_text()
        + "from gpuhost.pve.guests import guests_of\n"
        + "guests = [g for g in guests_of(hosts[0]) if g[0] == 'ct200']\n"
    )
    rc, _, err = twin.run("pct start 200")
    assert rc == 0, err
    run = subprocess.run(
        [
            str(PYINFRA),
            "-y",
            "-vvv",  # shows the command's output
            str(inv),
            "--limit",
            "ct200",
            "exec",
            "--",
            "cat",
            "/etc/hostname",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout + run.stderr
    assert re.search(r"\[ct200\]\s+ct200$", out, re.MULTILINE), out
    assert f"[{twin.name}]" not in run.stdout + run.stderr
