"""A PVE 9 twin (profile kpro6-pve9): Debian 13 userland, PVE 9 packages, and what
pve-container 6 does differently from 5: a devN added to a running container is hotplugged
(c702167, 6.0.4), a changed one still waits for the next start; created containers default to
unprivileged (103068a, 6.0.6).

Majors 195 has no driver on the test machine, so a node the cgroup allows opens with ENXIO and
one it does not allow with EPERM (the kernel's device controller decides, not the twin).
"""

from __future__ import annotations

import errno

import pytest

twin_profile = "kpro6-pve9"
CONF_101 = "arch: amd64\nhostname: ct101\ndev0: /dev/nvidia0\n"
OPEN = "python3 -c 'import os, sys\ntry: os.close(os.open(sys.argv[1], os.O_RDWR)); print(0)\nexcept OSError as e: print(e.errno)' "


@pytest.fixture(scope="module")
def ct101(twin):
    nodes = "; ".join(f"mknod /dev/nvidia{i} c 195 {i}" for i in range(3))
    assert twin.run(f"{nodes}; cat > /etc/pve/lxc/101.conf <<'EOF'\n{CONF_101}EOF")[0] == 0
    rc, _, err = twin.run("pct start 101")
    assert rc == 0, err
    yield twin
    twin.run("pct stop 101")


def test_userland_and_packages_are_pve9(twin) -> None:
    assert twin.host.file("/etc/os-release").contains("VERSION_CODENAME=trixie")
    versions = twin.run("dpkg-query -W -f '${Package} ${Version}\\n' pve-manager qemu-server")[1]
    assert versions.split("\n")[:2] == ["pve-manager 9.0.10", "qemu-server 9.0.21"]
    assert twin.run("uname -r")[1].strip() == "6.14.8-2-pve"


def opened(twin, path: str) -> int:
    rc, out, err = twin.run(f"pct exec 101 -- {OPEN}{path}")
    assert rc == 0, err
    return int(out)


def test_a_new_dev_is_hotplugged_into_the_running_container(ct101) -> None:
    twin = ct101
    assert opened(twin, "/dev/nvidia0") == errno.ENXIO
    rc, _, err = twin.run("pct set 101 -dev1 /dev/nvidia1,mode=0640,gid=44")
    assert rc == 0, err
    conf = twin.run("cat /etc/pve/lxc/101.conf")[1]
    assert "dev1: /dev/nvidia1,mode=0640,gid=44\n" in conf and "[pve:pending]" not in conf
    assert twin.run("pct exec 101 -- stat -c '%t:%T %a %g' /dev/nvidia1")[1] == "c3:1 640 44\n"
    assert opened(twin, "/dev/nvidia1") == errno.ENXIO  # the cgroup allows it now
    assert twin.run("pct exec 101 -- mknod /tmp/n2 c 195 2")[0] == 0
    assert opened(twin, "/tmp/n2") == errno.EPERM  # exactly that node, not the whole major


def test_a_changed_dev_still_waits_for_the_next_start(ct101) -> None:
    twin = ct101
    rc, _, err = twin.run("pct set 101 -dev0 /dev/nvidia2")
    assert rc == 0, err
    conf = twin.run("cat /etc/pve/lxc/101.conf")[1]
    assert conf.endswith("[pve:pending]\ndev0: /dev/nvidia2\n"), conf
    assert opened(twin, "/dev/nvidia0") == errno.ENXIO


def test_version_and_qemu_are_pve9s(twin) -> None:
    out = twin.run("pvesh get /version --output-format json")[1]
    assert '"release":"9.0"' in out.replace(" ", "") and '"version":"9.0.10"' in out.replace(
        " ", ""
    )
    vm = "machine: q35\nname: vm140\n"
    assert twin.run(f"cat > /etc/pve/qemu-server/140.conf <<'EOF'\n{vm}EOF")[0] == 0
    rc, _, err = twin.run("qm start 140")
    assert rc == 0, err
    status = twin.run(f"pvesh get /nodes/{twin.name}/qemu/140/status/current --output-format json")
    text = status[1].replace(" ", "")
    assert '"running-machine":"pc-q35-10.0+pve0"' in text and '"running-qemu":"10.0.2"' in text
    twin.run("qm stop 140")


def test_created_containers_default_to_unprivileged(twin) -> None:
    rc, _, err = twin.run(f"pvesh create /nodes/{twin.name}/lxc --vmid 150 --hostname ct150")
    assert rc == 0, err
    assert "unprivileged: 1\n" in twin.run("cat /etc/pve/lxc/150.conf")[1]


def test_without_bootctl_the_systemd_boot_trial_is_refused(twin) -> None:
    """On Debian 13 bootctl is in systemd-boot-tools, and pve8to9 asks for the systemd-boot
    meta-package to go (pve-manager PVE/CLI/pve8to9.pm, check_bootloader): a host left without
    bootctl has no one-shot, which the plan says before anything changes."""
    from gpuhost.observe.boot import boot_path_command, parse_boot_path
    from gpuhost.observe.hostfacts import FACTS, fact_command
    from gpuhost.plan.trial.boot import plan_trial_boot

    def trial():
        rc, out, err = twin.run(boot_path_command())
        assert rc == 0, err
        path = parse_boot_path(out.splitlines())
        rc, out, err = twin.run(fact_command("BootTool"))
        assert rc == 0, err
        tool = FACTS["BootTool"][0]().process(out.splitlines())
        running = twin.run("uname -r")[1].strip()
        return path, plan_trial_boot(running, running, path, tool, options="quiet")

    path, planned = trial()
    assert path.bootctl is True and planned.can_apply, planned.refusal
    hide = "for f in /usr/bin/bootctl /usr/local/bin/bootctl; do mv $f $f.away; done"
    assert twin.run(hide)[0] == 0
    try:
        path, planned = trial()
        assert path.bootctl is False and not planned.can_apply
        assert "apt install systemd-boot-tools" in (planned.refusal or "")
    finally:
        twin.run("for f in /usr/bin/bootctl /usr/local/bin/bootctl; do mv $f.away $f; done")
