"""Proxmox VE 9: the main deploy converges on kpro6 as it is after the upgrade, and the audit of
it with its guests passes; GPUs move between its container and VM and back, and the guest
deploy gives the Debian 13 container CUDA and a venv, each converging the way it does on PVE 8.

The twin (profile kpro6-pve9) stands on the Debian 13 base: trixie's userland, kmod,
initramfs-tools and GRUB tools, pve-container 6, the PVE 9.0 kernel 6.14.8-2-pve built by
GCC 14.2.0. Its NVIDIA modules are built the way the host's would be: inside the trixie base,
with its gcc-14 against its kernel headers (stamped with the twin kernel's release).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.e2e.conftest import deploy, inventory, with_driver
from tests.e2e.guests import (
    SPEC,
    VERSION,
    audit,
    deploy_host,
    give_readiness,
    place_guests,
)
from tests.e2e.test_gpu_moves import (
    BOARDS,
    CT200,
    MOVING,
    VM129,
    converge,
    ct_nodes,
    put,
    running,
    spec,
    vm_mappings,
)
from tests.e2e.test_guest_software import PIN, VENV, Site, changed, quote, software_audit
from tests.e2e.test_guest_software import run as run_guest
from tests.e2e.test_vfio_binding import drivers
from twin import cudarepo, node, userspace
from twin import driver as twin_driver
from twin.hwtesting import ModuleCache, needs_root
from twin.pytest_plugin import TwinHandle

KERNEL = "6.14.8-2-pve"
PVE9_SPEC = copy.deepcopy(SPEC)
# After the upgrade: PVE 9's packaged kernel (no source build), and the compiler that built it.
PVE9_SPEC["kernel"] = {"version": KERNEL}
PVE9_SPEC["toolchain"] = {"gcc": "14.2.0"}


def pve9_spec(vm_gpus: list[str]) -> dict:
    """kpro6's spec after the upgrade, VM 129 given ``vm_gpus`` (the rest stay in CT 200)."""
    moved = spec(vm_gpus)
    moved["kernel"], moved["toolchain"] = PVE9_SPEC["kernel"], PVE9_SPEC["toolchain"]
    return moved


@pytest.fixture(scope="module")
def trixie_modules(trixie_base: Path) -> ModuleCache:
    """NVIDIA-named .ko files built in the trixie base with gcc-14 (cached per machine)."""
    problem = needs_root()
    if problem:
        pytest.skip(problem)
    return ModuleCache(sysroot=trixie_base, cc="gcc-14")


def test_main_deploy_converges_on_pve9_and_the_audit_passes(
    fresh, trixie_modules, tmp_path: Path
) -> None:
    twin = fresh("kpro6-pve9")
    host = twin.host
    assert host.file("/etc/os-release").contains("VERSION_CODENAME=trixie")
    assert twin.run("dpkg-query -W -f '${Version}' pve-container")[1] == "6.0.11"
    assert host.file("/proc/version").contains(f"^Linux version {KERNEL} .*gcc.* 14\\.2\\.0")
    assert twin.run("gcc-14 -dumpfullversion")[1].strip() == "14.2.0"

    inv = tmp_path / "kpro6.py"
    first = deploy_host(twin, trixie_modules, inv, PVE9_SPEC)
    assert first.reboots == 1, first.output[-3000:]  # the trial boot of the new command line
    assert twin.host.file("/proc/driver/nvidia/version").contains("gcc version 14.2.0")
    second = deploy(inv)
    assert second.rc == 0, second.output[-3000:]
    assert second.reboots == 0 and not second.changed, second.output[-3000:]

    place_guests(twin)  # ct200 (trixie userland, pve-container 6 devN) and vm129 on vfio-pci
    give_readiness(twin, inv)
    assert "VERSION_CODENAME=trixie" in twin.run("pct exec 200 -- cat /etc/os-release")[1]
    failed = audit(twin, inv)
    assert failed == {}, json.dumps(failed, indent=1)


def test_gpu_moves_and_the_guest_deploy_converge_on_pve9(
    fresh, trixie_modules, tmp_path: Path
) -> None:
    """On the PVE 9 twin: two boards move from CT 200 to VM 129 and back (pve-container 6
    hotplugs the new devN into the running CT, qemu-server 9 takes the mapped hostpci), each
    second run changes nothing; then the guest deploy gives the Debian 13 container NVIDIA's
    debian13 repository (deb822, Signed-By), two CUDA 13 toolkits and a uv venv on its Python
    3.13, converging the same way, and the audit of host and guest passes."""
    twin = fresh("kpro6-pve9")
    with_driver(twin, trixie_modules, VERSION)
    userspace.install_root(twin.root, VERSION)
    put(twin, "/etc/pve/lxc/200.conf", CT200)
    put(twin, "/etc/pve/qemu-server/129.conf", VM129)
    env = {"GPUHOST_PVE_TOKEN": (twin.twin.dir / "api-token").read_text().strip()}
    inv = tmp_path / "kpro6.py"
    two = ["0000:c1:00.0", "0000:e1:00.0"]
    inventory(inv, twin, pve9_spec(two))
    converge(twin, inv, env)
    for tool, vmid in (("pct", 200), ("qm", 129)):
        rc, _, err = twin.run(f"{tool} start {vmid}")
        assert rc == 0, err
    twin_driver.install_userspace(node.Twin.load(twin.name), 200, VERSION)  # as an operator does
    boot_id = twin.boot_id()

    inventory(inv, twin, pve9_spec([*two, *MOVING]))
    moved = deploy(inv, env=env)
    assert moved.rc == 0, moved.output[-5000:]
    assert drivers(twin, BOARDS) == dict.fromkeys(BOARDS, "vfio-pci")
    assert vm_mappings(twin) == sorted(
        f"gpuhost-{b[:-2].replace(':', '-')}" for b in [*two, *MOVING]
    )
    assert len([n for n in ct_nodes(twin) if n[-1].isdigit()]) == 4
    assert running(twin, "pct", 200) and running(twin, "qm", 129)
    again = deploy(inv, env=env)
    assert again.rc == 0 and not again.changed, again.output[-3000:]

    inventory(inv, twin, pve9_spec(two))
    back = deploy(inv, env=env)
    assert back.rc == 0, back.output[-5000:]
    assert twin.boot_id() == boot_id  # neither move rebooted the host
    assert drivers(twin, BOARDS) == {
        b: "nvidia" if b.endswith(".0") else "snd_hda_intel" for b in BOARDS
    }
    assert len([n for n in ct_nodes(twin) if n[-1].isdigit()]) == 6
    rc, out, _ = twin.run("pct exec 200 -- sh -c 'ls /dev/nvidia[0-9]*'")
    assert rc == 0 and len(out.split()) == 6, out
    again = deploy(inv, env=env)
    assert again.rc == 0 and not again.changed, again.output[-3000:]

    # The guest deploy in the Debian 13 container: NVIDIA's debian13 repository (a stand-in
    # laid out where NVIDIA's is, carrying what NVIDIA's does: the 13.x toolkits, no 12.x, as
    # gpuhost/guestsw/cudarepos.py PUBLISHED cites), its two toolkits side by side, a venv on Python 3.13.
    repo = cudarepo.build(tmp_path / "cuda", ["13.0", "13.1"])
    old = cudarepo.build(tmp_path / "old", ["12.8", "13.0"])  # debian12's, for Debian 12 guests
    weak = cudarepo.build(tmp_path / "weak", ["13.0"], cert_digest="SHA1")  # bound as 3bf863cc
    site = tmp_path / "site"
    with cudarepo.serve(site) as base:
        debian13 = base + cudarepo.publish(site, repo, "debian13")
        debian12 = base + cudarepo.publish(site, old, "debian12")
        weak_url = base + "weak/" + cudarepo.publish(site / "weak", weak, "debian13")
        sw = Site(twin, tmp_path / "guest.py", {}, repo, debian13)
        refused(
            sw,
            trixie_guest(twin, repo.key, debian13, ["12.8", "13.0"]),
            "CUDA 12.8 is not published in NVIDIA's debian13 repository (it has 13.0, 13.1)",
        )
        refused(
            sw,
            trixie_guest(twin, old.key, debian12, ["13.0"]),
            f"cuda_repo.url {debian12} is NVIDIA's debian12 repository, but the guest runs "
            "Debian GNU/Linux 13 (trixie)",
        )
        refused(
            sw,
            trixie_guest(twin, weak.key, weak_url, ["13.0"]),
            f"cuda_repo.keyring {weak.key}: the guest's apt verifies with Sequoia (sqv)",
            "its self-signatures use SHA-1 only",
        )
        # the guest's own apt (3.0, sqv) agrees: it does not trust a repository that key signs
        rc, out, err = sw.guest(by_hand_update(weak.key.read_text(), weak_url))
        assert rc != 0 and "SHA1 is not considered secure" in out + err, out + err

        spec = trixie_guest(twin, repo.key, debian13, ["13.0", "13.1"])
        sw.write(spec)
        first = run_guest(sw)
        assert first.rc == 0, first.output[-4000:]
        for version, release in (("13.0", "13.0.2"), ("13.1", "13.1.0")):
            rc, out, _ = sw.guest(f"/usr/local/cuda-{version}/bin/nvcc --version")
            assert rc == 0 and f"release {version}, V{release}" in out, out
        rc, out, _ = sw.guest(
            "readlink -f /usr/local/cuda; cat /etc/apt/sources.list.d/gpuhost-cuda.sources"
        )
        assert out.startswith("/usr/local/cuda-13.0\n"), out
        assert (
            f"URIs: {debian13}\n" in out and "Signed-By: /etc/apt/keyrings/gpuhost-cuda.asc" in out
        )
        rc, out, _ = sw.guest(
            f". {VENV}/bin/activate && python -c 'import sys, pluggy, pytest; "
            "print(sys.version_info[:2], pluggy.__version__)' && echo CUDA_HOME=$CUDA_HOME"
        )
        assert rc == 0 and "(3, 13) 1.5.0" in out and "CUDA_HOME=/usr/local/cuda-13.0" in out, out
        second = run_guest(sw)
        assert second.rc == 0 and changed(second) == 0, second.output[-3000:]

        inventory(inv, twin, spec)  # one spec for the host and its guest's software
        host_again = deploy(inv, env=env)
        assert host_again.rc == 0 and not host_again.changed, host_again.output[-3000:]
        failed = audit(twin, inv)
        assert failed == {}, json.dumps(failed, indent=1)
        sw.write(spec)
        assert software_audit(sw) == {}  # the guest software checks ran, and passed


def trixie_guest(twin: TwinHandle, key: Path, url: str, cuda: list[str]) -> dict:
    """kpro6-pve9's spec (VM 129 with two boards) whose CT 200 gets CUDA ``cuda`` and a venv."""
    spec = pve9_spec(["0000:c1:00.0", "0000:e1:00.0"])
    (ct,) = [g for g in spec["guests"] if g["kind"] == "lxc"]
    web = f"--bind={twin.twin.guest_address(200)}"  # the venv's python serves on the guest
    ct.update(
        access={"ssh_hostname": twin.twin.guest_address(200)},
        cuda=cuda,
        cuda_default=cuda[-1] if len(cuda) == 1 else "13.0",
        cuda_repo={"url": url, "keyring": str(key)},
        venvs=[
            {
                "path": VENV,
                "python": "3.13",  # Debian 13's system python
                "cuda": "13.0",
                "packages": ["pytest==8.3.3"],
                "constraints": [PIN],
                "service": {"name": "web", "command": ["python", "-m", "http.server", web]},
            }
        ],
    )
    return spec


def refused(sw: Site, spec: dict, *messages: str) -> None:
    """The guest deploy is refused at plan time with ``messages``; the guest keeps no source."""
    sw.write(spec)
    result = run_guest(sw)
    assert result.rc != 0 and "the guest software plan is refused" in result.output, result.output[
        -3000:
    ]
    for message in messages:
        assert message in result.output, result.output[-3000:]
    _rc, out, _ = sw.guest("ls /etc/apt/sources.list.d; dpkg-query -W 'cuda-*' 2>&1")
    assert "gpuhost-cuda" not in out and "cuda-toolkit" not in out, out


def by_hand_update(key: str, url: str) -> str:
    """apt-get update of only ``url`` signed by ``key``, as an operator would write it."""
    return (
        "d=$(mktemp -d); mkdir -p /etc/apt/keyrings; "
        f"printf '%s' {quote(key)} > /etc/apt/keyrings/by-hand.asc; "
        f"printf 'Types: deb\\nURIs: {url}\\nSuites: /\\nSigned-By: /etc/apt/keyrings/by-hand.asc\\n' "
        "> $d/by-hand.sources; "
        "apt-get update -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$d 2>&1; "
        "rc=$?; rm -rf $d /etc/apt/keyrings/by-hand.asc; exit $rc"
    )
