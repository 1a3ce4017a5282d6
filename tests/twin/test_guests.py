"""LXC guests: real containers whose device nodes are exactly what their Proxmox config grants.

The twin host's nodes are made here with mknod, as the simulated boot makes them; majors 195 and
511 have no driver on the test machine, so an allowed node opens with ENXIO and a node whose major
the config does not allow opens with EPERM (the kernel's device controller decides, not the twin).
"""

import errno

import pytest

from twin import processes
from twin.pytest_plugin import PVE_DIRS

OPEN_ALL = (
    "python3 -c 'import os, sys\n"
    "for p in sys.argv[1:]:\n"
    "    try: os.close(os.open(p, os.O_RDWR)); print(p, 0)\n"
    "    except OSError as e: print(p, e.errno)' "
)

CONF_101 = """\
# GPU container
arch: amd64
hostname: gpu-ct
dev0: /dev/nvidiactl,gid=44,mode=0666
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 509:* rwm
lxc.cgroup.devices.allow: c 511:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
"""


@pytest.fixture(scope="module")
def gpu_twin(twin):
    # Live majors on the twin host: nvidia-uvm is at 511 now, while the conf still allows 509.
    nodes = "mknod /dev/nvidia0 c 195 0; mknod /dev/nvidia1 c 195 1; mknod /dev/nvidiactl c 195 255"
    assert twin.run(f"{nodes}; mknod /dev/nvidia-uvm c 511 0")[0] == 0
    twin.run(f"{PVE_DIRS}; cat > /etc/pve/lxc/101.conf <<'EOF'\n{CONF_101}EOF")
    rc, _, err = twin.request('{"op": "ct-start", "ctid": 101}')
    assert rc == 0, err
    yield twin
    twin.request('{"op": "ct-stop", "ctid": 101}')


def _opened(endpoint, *paths):
    rc, out, err = endpoint.run(OPEN_ALL + " ".join(paths))
    assert rc == 0, err
    return {p: int(e) for p, e in (line.split() for line in out.splitlines())}


def test_guest_is_reachable_with_its_own_host_key(gpu_twin):
    guest = gpu_twin.guest(101)
    rc, out, _ = guest.run("uname -n; cat /etc/hostname")
    assert (rc, out) == (0, "gpu-ct\ngpu-ct\n")
    assert guest.address in guest.known_hosts.read_text()


def test_guest_gets_exactly_the_granted_nodes(gpu_twin):
    guest = gpu_twin.guest(101)
    out = guest.run("ls /dev | grep nvidia")[1]
    assert out.split() == ["nvidia-uvm", "nvidia0", "nvidiactl"]  # nvidia1 was not granted
    out = guest.run("stat -c '%n %t:%T %a %g' /dev/nvidiactl /dev/nvidia0")[1]
    # devN: a private node with the CT's mode and gid; a raw mount entry binds the host's own node.
    assert out.splitlines() == ["/dev/nvidiactl c3:ff 666 44", "/dev/nvidia0 c3:0 644 0"]


def test_allowed_major_reaches_the_kernel_stale_major_does_not(gpu_twin):
    result = _opened(gpu_twin.guest(101), "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")
    assert result["/dev/nvidia0"] == errno.ENXIO  # allowed; no driver on this machine
    assert result["/dev/nvidiactl"] == errno.ENXIO  # devN: its live major:minor is allowed
    # conf allows 509, the node is 511; its v1 rule for 511 does nothing on a pure cgroup2 host
    assert result["/dev/nvidia-uvm"] == errno.EPERM


def test_mknod_does_not_bypass_the_rules(gpu_twin):
    guest = gpu_twin.guest(101)
    assert guest.run("mknod /tmp/sneak c 195 1")[0] == 0  # lxc allows mknod (m) of any node...
    assert _opened(guest, "/tmp/sneak")["/tmp/sneak"] == errno.ENXIO
    assert guest.run("mknod /tmp/sneak2 c 511 0")[0] == 0
    assert _opened(guest, "/tmp/sneak2")["/tmp/sneak2"] == errno.EPERM  # ...but not open


def test_guest_rootfs_is_its_own_and_persists(gpu_twin):
    guest = gpu_twin.guest(101)
    assert guest.run("echo mine > /root/in-guest")[0] == 0
    assert gpu_twin.run("test -e /root/in-guest")[0] == 1
    assert gpu_twin.request('{"op": "ct-stop", "ctid": 101}')[0] == 0
    assert gpu_twin.request('{"op": "ct-status", "ctid": 101}')[1] == "status: stopped\n"
    assert gpu_twin.request('{"op": "ct-start", "ctid": 101}')[0] == 0
    assert guest.run("cat /root/in-guest")[1] == "mine\n"


def test_exec_passes_exit_status(gpu_twin):
    req = '{"op": "ct-exec", "ctid": 101, "argv": ["sh", "-c", "echo hi; exit 7"]}'
    assert gpu_twin.request(req)[:2] == (7, "hi\n")


def test_proxmox_errors(gpu_twin):
    rc, _, err = gpu_twin.request('{"op": "ct-start", "ctid": 101}')
    assert (rc, err) == (255, "CT 101 already running\n")
    rc, _, err = gpu_twin.request('{"op": "ct-stop", "ctid": 999}')
    assert rc == 255 and "lxc/999.conf' does not exist" in err
    gpu_twin.run("printf 'dev0: /dev/nvidia7\\n' > /etc/pve/lxc/102.conf")
    assert gpu_twin.request('{"op": "ct-start", "ctid": 102}')[1:] == (
        "",
        "Device /dev/nvidia7 does not exist\n",
    )
    gpu_twin.run("printf 'dev0: /dev/shm\\n' > /etc/pve/lxc/102.conf")
    assert gpu_twin.request('{"op": "ct-start", "ctid": 102}')[2] == "/dev/shm is not a device\n"


def test_reboot_stops_guests_and_starts_onboot_ones(gpu_twin):
    gpu_twin.run("printf 'onboot: 1\\ndev0: /dev/zero\\n' > /etc/pve/lxc/103.conf")
    gpu_twin.reboot()
    assert gpu_twin.run("test -e /dev/nvidia0")[0] == 1  # volatile /dev; no hardware here
    guest = gpu_twin.guest(103)
    assert processes.wait_port(
        guest.address, 22, timeout=15
    )  # Proxmox starts onboot CTs after boot
    assert guest.run("head -c1 /dev/zero | od -An -tx1")[1].strip() == "00"
    # CT 101 has no onboot: a host reboot leaves it stopped, and its nodes are gone with /dev.
    assert gpu_twin.request('{"op": "ct-status", "ctid": 101}')[1] == "status: stopped\n"
    rc, _, err = gpu_twin.request('{"op": "ct-start", "ctid": 101}')
    assert (rc, err) == (255, "Device /dev/nvidiactl does not exist\n")
    gpu_twin.run("mknod /dev/nvidiactl c 195 255")
    assert gpu_twin.request('{"op": "ct-start", "ctid": 101}')[0] == 0
