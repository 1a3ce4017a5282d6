"""VMs get their GPUs through PCI mappings and the API token, on a kpro6 twin whose Proxmox API
follows real PVE's permission model: the hand-made raw entries are taken over as root, mappings
are created through the token, a backup is kept, and a second run changes nothing."""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.conftest import deploy, inventory, with_driver
from twin.pytest_plugin import Fleet, TwinHandle

VERSION = "580.95.05"
VM129 = "machine: pc-q35-8.1\nname: vm129\nhostpci0: 0000:c1:00,pcie=1\nhostpci1: 0000:e1:00,pcie=1\nhostpci4: 0000:03:00.0\n"


def spec(kernel: str) -> dict:
    return {
        "kernel": {"version": kernel},
        "driver": {"version": VERSION, "open": True},
        "guests": [
            {
                "kind": "vm",
                "vmid": 129,
                "name": "vm129",
                "machine": "q35",
                "gpus": ["0000:c1:00.0", "0000:e1:00.0"],
            },
            {"kind": "lxc", "ctid": 200, "name": "ct200", "gpus": "rest"},
        ],
    }


def token_env(twin: TwinHandle) -> dict[str, str]:
    return {"GPUHOST_PVE_TOKEN": (twin.twin.dir / "api-token").read_text().strip()}


def put(twin: TwinHandle, path: str, text: str) -> None:
    rc, _, err = twin.run(f"mkdir -p $(dirname {path}) && cat > {path} <<'EOF'\n{text}EOF")
    assert rc == 0, err


def test_mappings_and_hostpci_through_the_token(fresh, modules, tmp_path: Path) -> None:
    twin = fresh("kpro6")
    kernel = with_driver(twin, modules, VERSION)
    put(twin, "/etc/pve/qemu-server/129.conf", VM129)
    inv = inventory(tmp_path / "kpro6.py", twin, spec(kernel))

    # without a token the run stops when it first needs the API, naming the variable
    first = deploy(inv)
    assert first.rc != 0 and "export GPUHOST_PVE_TOKEN=" in first.output, first.output[-3000:]

    done = deploy(inv, env=token_env(twin))
    assert done.rc == 0, done.output[-4000:]
    conf = (twin.root / "etc/pve/qemu-server/129.conf").read_text()
    assert "hostpci0: mapping=gpuhost-0000-c1-00,pcie=1" in conf
    assert "hostpci1: mapping=gpuhost-0000-e1-00,pcie=1" in conf
    assert "hostpci4: 0000:03:00.0" in conf  # the user's own entry is left alone
    assert "machine: q35" in conf
    mappings = (twin.root / "etc/pve/mapping/pci.cfg").read_text()
    assert "gpuhost-0000-c1-00\n" in mappings and f"node={twin.name}" in mappings
    assert "path=0000:c1:00" in mappings and "id=10de:2bb1" in mappings
    backups = sorted((twin.root / "var/lib/gpuhost/backups").glob("qemu-129-*.conf"))
    # one before the hostpci change (and one before the readiness hookscript, a second apart)
    assert len(backups) in (1, 2) and "hostpci0: 0000:c1:00,pcie=1" in backups[0].read_text()

    again = deploy(inv, env=token_env(twin))
    assert again.rc == 0 and not again.changed, again.output[-3000:]

    # a config edited under gpuhost's feet: its owned entry now names another device
    put(
        twin,
        "/etc/pve/qemu-server/129.conf",
        conf.replace("mapping=gpuhost-0000-e1-00", "mapping=gpuhost-0000-41-00"),
    )
    fixed = deploy(inv, env=token_env(twin))
    assert fixed.rc == 0, fixed.output[-3000:]
    assert (
        "hostpci1: mapping=gpuhost-0000-e1-00,pcie=1"
        in (twin.root / "etc/pve/qemu-server/129.conf").read_text()
    )


def fleet_inventory(path: Path, twins: list[TwinHandle], kernel: str) -> Path:
    """Both twins in one inventory, each with its own API token file (as inventory/twin.py)."""
    hosts = []
    for t in twins:
        own = {**spec(kernel), "proxmox": {"token_file": str(t.twin.dir / "api-token")}}
        hosts.append(
            f"gpu_host({t.name!r}, {own!r}, ssh_hostname={t.address!r}, ssh_user='root', "
            f"ssh_key={str(t.key)!r}, ssh_known_hosts_file={str(t.known_hosts)!r}, "
            "ssh_strict_host_key_checking='yes', gpuhost_reboot_delay=1)"
        )
    path.write_text(f"from gpuhost.spec.inventory import gpu_host\nhosts = [{', '.join(hosts)}]\n")
    return path


def test_each_host_of_a_fleet_gets_its_mappings_through_its_own_api(
    twin_fleet: Fleet, modules, tmp_path: Path
) -> None:
    """Two kpro6 twins in one inventory (benchmarks/rerun.py --fleet 2): each host's mappings and
    VM entries go to that host's own API with its own token, not to the first host's."""
    twins = twin_fleet.start(2, "kpro6")
    try:
        kernels = {with_driver(t, modules, VERSION) for t in twins}
        assert len(kernels) == 1, kernels
        for t in twins:
            put(t, "/etc/pve/qemu-server/129.conf", "machine: q35\nname: vm129\n")
            put(t, "/etc/pve/lxc/200.conf", "arch: amd64\nhostname: ct200\nostype: debian\n")
        inv = fleet_inventory(tmp_path / "fleet.py", twins, kernels.pop())

        done = deploy(inv)
        assert done.rc == 0, done.output[-4000:]
        for t in twins:
            mappings = (t.root / "etc/pve/mapping/pci.cfg").read_text()
            assert mappings.count("\tmap ") == 2 and mappings.count(f"node={t.name},") == 2, (
                t.name,
                mappings,
            )
            conf = (t.root / "etc/pve/qemu-server/129.conf").read_text()
            assert "hostpci0: mapping=gpuhost-0000-c1-00,pcie=1" in conf, (t.name, conf)
        again = deploy(inv)
        assert again.rc == 0 and not again.changed, again.output[-3000:]
    finally:
        for t in twins:
            twin_fleet.stop(t)


def test_a_gpu_given_twice_is_refused_with_nothing_changed(fresh, tmp_path: Path) -> None:
    """Twice in the spec, or once in the spec and once in a VM's own raw entry: refused before
    anything changes, each problem named."""
    from tests.e2e.conftest import manifest

    twin = fresh("kpro6")
    put(
        twin,
        "/etc/pve/qemu-server/130.conf",
        "machine: q35\nname: vm130\nhostpci0: 0000:41:00,pcie=1\n",
    )
    kernel = twin.run("uname -r")[1].strip()
    twice = spec(kernel)
    twice["guests"][1]["gpus"] = [6, 0]  # index 6 is 0000:c1:00.0: only the host can tell
    before = manifest(twin.root)
    run = deploy(inventory(tmp_path / "twice.py", twin, twice), env=token_env(twin))
    assert run.rc != 0 and "the plan is refused" in run.output, run.output[-3000:]
    assert (
        "GPU 0000:c1:00.0 (named as index 6) is already given to vm 129 (vm129) (named as "
        "0000:c1:00.0)" in run.output
    )
    assert "vm 130 has hostpci0: 0000:41:00,pcie=1, an entry gpuhost does not own" not in run.output
    rest = spec(kernel)  # ct200 takes 'rest', which includes 0000:41:00.0
    run = deploy(inventory(tmp_path / "raw.py", twin, rest), env=token_env(twin))
    assert run.rc != 0 and "the plan is refused" in run.output, run.output[-3000:]
    assert (
        "vm 130 has hostpci0: 0000:41:00,pcie=1, an entry gpuhost does not own, passing GPU "
        "0000:41:00 that the spec gives to lxc 200 (ct200)" in run.output
    )
    assert manifest(twin.root) == before


def test_a_mapping_written_before_the_iommu_came_on_is_refreshed_before_the_vm_starts(
    fresh, modules, tmp_path: Path
) -> None:
    """The lumped board (Intel): no IOMMU, so no groups, until the deploy's reboot turns it on.
    The mapping is written before that reboot, without a group; Proxmox's start check
    (pve-guest-common Mapping/PCI.pm assert_valid, twin/pve/mapping.py) then wants the group the
    device has now. The running VM stopped for the reboot runs after it (the deploy refreshes the
    mapping before it starts guests; on that trial boot pve-guests waits for the commit). The VM
    is `onboot`: at a later plain reboot, pve-guests.service starts it before any deploy
    (twin/guests.py start_onboot), so a group that changed is refreshed by then
    (gpuhost-pci-mappings.service)."""
    twin = fresh("lumped")
    kernel = with_driver(twin, modules, VERSION)
    put(
        twin,
        "/etc/pve/qemu-server/141.conf",
        "cores: 2\nmachine: q35\nmemory: 4096\nname: vm141\nonboot: 1\n",
    )
    rc, _, err = twin.run("qm start 141")
    assert rc == 0, err
    gpu = "0000:4b:00.0"  # on its own root port: group 31 once the IOMMU is on
    lumped = {
        "kernel": {"version": kernel, "trial": {"without_oneshot": True}},  # GRUB on LVM
        "driver": {"version": VERSION, "open": True},
        "guests": [
            {"kind": "vm", "vmid": 141, "name": "vm141", "machine": "q35", "gpus": [gpu]},
            {"kind": "lxc", "ctid": 300, "name": "ct300", "gpus": "rest"},
        ],
    }
    inv = inventory(tmp_path / "lumped.py", twin, lumped)
    done = deploy(inv, env=token_env(twin))
    assert done.rc == 0 and done.reboots == 1, done.output[-5000:]
    twin.reconnect()
    assert "iommugroup=31" in (twin.root / "etc/pve/mapping/pci.cfg").read_text()
    rc, out, _ = twin.run("qm status 141")
    assert out.strip() == "status: running", out
    # a plain reboot with yesterday's group in the mapping: the boot unit refreshes it before
    # pve-guests starts the onboot VM, with no deploy involved
    cfg = twin.root / "etc/pve/mapping/pci.cfg"
    cfg.write_text(cfg.read_text().replace("iommugroup=31", "iommugroup=7"))
    log = twin.root / "var/log/gpuhost-twin/guest-power.log"
    seen = len(log.read_text().splitlines())
    twin.reboot()
    assert "iommugroup=31" in cfg.read_text()

    def started_by_the_boot() -> bool:  # SSH answers before pve-guests has started the guests
        since = [line.split()[1:] for line in log.read_text().splitlines()[seen:]]
        return since == [["start", "qemu", "141", "boot"]]

    deadline = time.monotonic() + 30
    while not started_by_the_boot() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert started_by_the_boot(), log.read_text()
    rc, out, _ = twin.run("qm status 141")
    assert out.strip() == "status: running", out
    again = deploy(inv, env=token_env(twin))
    assert again.rc == 0 and not again.changed, again.output[-3000:]
