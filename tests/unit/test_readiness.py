"""The readiness check at guest start (gpuhost/plan/guests/readiness.py, files/gpuhost-ready):
what the Plan puts in each GPU guest's contract and hookscript entry, the user's own hookscript
kept and given back, the `local` storage's snippets content; then the hookscript itself, run
with python3 against a temporary root shaped like the host."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuhost.observe.hostfacts import HostFacts
from gpuhost.paths import HOOKSCRIPT, HOOKSCRIPT_VOLID
from gpuhost.plan.guests.containers import plan_containers
from gpuhost.plan.guests.readiness import plan_readiness, ready_path, snippet_path, storages
from gpuhost.plan.make import make_plan
from gpuhost.spec.host import HostSpec
from tests.unit.hosts import kpro6

SCRIPT = Path(__file__).resolve().parents[2] / "files" / "gpuhost-ready"
KPRO6 = {"kernel": {"version": "6.8.12-9-pve"}, "driver": {"version": "580.95.05"}}
STORAGE = "dir: local\n\tpath /var/lib/vz\n\tcontent iso,vztmpl,backup\n"
CT = "arch: amd64\nhostname: ct200\nostype: debian\nunprivileged: 1\n"
VM = "machine: q35\nname: vm129\n"


def facts(
    ct: str = CT,
    vm: str = VM,
    storage: str | None = STORAGE,
    extra: dict[str, str] | None = None,
    others: tuple[str, ...] = (),
) -> HostFacts:
    files = {"/etc/kernel/cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet\n", **(extra or {})}
    if storage is not None:
        files["/etc/pve/storage.cfg"] = storage
    lines = [f"F {p} {base64.b64encode(t.encode()).decode()}" for p, t in files.items()]
    configs = ["==> /etc/pve/lxc/200.conf <==", *ct.splitlines()]
    for other in others:
        configs += [f"==> /etc/pve/lxc/{other.split()[0]}.conf <==", *other.split(" ", 1)[1:]]
    configs += ["==> /etc/pve/qemu-server/129.conf <==", *vm.splitlines()]
    return kpro6(
        PveGuestConfigs=(0, configs),
        ConfigFiles=(0, lines),
        PveContainerVersion=(0, ["ii  5.3.5"]),
        CharDevices=(0, ["Character devices:", "195 nvidia", "195 nvidiactl", "509 nvidia-uvm"]),
        BootId=(0, ["11111111-2222-3333-4444-555555555555"]),
        LoadedModules=(0, []),
    )


def spec(devices: str = "devN", **readiness: object) -> HostSpec:
    guest = {"kind": "lxc", "ctid": 200, "name": "ct200", "gpus": "rest", "devices": devices}
    vm = {"kind": "vm", "vmid": 129, "name": "vm129", "machine": "q35"}
    vm["gpus"] = ["0000:c1:00.0", "0000:e1:00.0"]
    return HostSpec.model_validate({**KPRO6, "guests": [vm, guest], "readiness": readiness})


def test_each_gpu_guest_gets_the_hookscript_and_its_contract() -> None:
    plan = make_plan("kpro6", spec(), facts())
    r = plan.readiness
    assert r.snippets_content == "iso,vztmpl,backup,snippets"
    assert {k: (h.wanted, h.current) for k, h in r.hooks.items()} == {
        ("lxc", 200): (HOOKSCRIPT_VOLID, None),
        ("qemu", 129): (HOOKSCRIPT_VOLID, None),
    }
    ct = r.contracts[("lxc", 200)]
    assert ct["guest"] == "CT 200 (ct200)" and ct["wait_s"] == 60 and ct["chain"] is None
    assert [n["path"] for n in ct["nodes"]][-3:] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert all(n["major"] is None for n in ct["nodes"])  # devN: Proxmox stat()s them at start
    assert ct["driver"] == "580.95.05" and ct["gsp"] is True and len(ct["gpus"]) == 6
    vm = r.contracts[("qemu", 129)]
    assert "0000:c1:00.0" in vm["vfio"] and [m["id"] for m in vm["mappings"]] == [
        "gpuhost-0000-c1-00",
        "gpuhost-0000-e1-00",
    ]
    assert plan.files[HOOKSCRIPT].content == SCRIPT.read_text()
    assert plan.files[HOOKSCRIPT].mode == "755"
    assert json.loads(plan.files[ready_path(200)].content or "") == ct


def test_raw_rules_name_their_majors_and_a_driver_change_is_not_checked_yet() -> None:
    wanted, seen = spec("raw", wait=5), facts()
    plan = make_plan("kpro6", wanted, seen)
    ct = plan.readiness.contracts[("lxc", 200)]
    assert plan.rebooting and ct["wait_s"] == 5
    assert all(n["major"] is None for n in ct["nodes"])  # the rules follow the boot's majors
    written = plan_containers(wanted, seen, plan.lxc_nodes, False, [], [])  # without a reboot
    r = plan_readiness(wanted, seen, plan.gpus, plan.lxc_nodes, plan.vm_functions,
                       plan.vm_split, written, (True, False, False), [])  # fmt: skip
    majors = {n["path"]: n["major"] for n in r.contracts[("lxc", 200)]["nodes"]}  # type: ignore[union-attr]
    assert majors["/dev/nvidia-uvm"] == 509 and majors["/dev/nvidia0"] == 195
    newer = HostSpec.model_validate({**spec().model_dump(), "driver": {"version": "595.71.05"}})
    ct = make_plan("kpro6", newer, facts()).readiness.contracts[("lxc", 200)]
    assert ct["driver"] is None and ct["gsp"] is False  # until the host runs it


def test_the_users_hookscript_is_chained_kept_and_given_back() -> None:
    own = "local:snippets/mine.sh"
    plan = make_plan("kpro6", spec(), facts(ct=CT + f"hookscript: {own}\n"))
    hook = plan.readiness.hooks[("lxc", 200)]
    assert (hook.current, hook.wanted) == (own, HOOKSCRIPT_VOLID)
    contract = plan.readiness.contracts[("lxc", 200)]
    assert contract["chain"] == {"volid": own, "path": "/var/lib/vz/snippets/mine.sh"}
    # The next run: the config names gpuhost's, the contract remembers the user's.
    done = {ready_path(200): plan.files[ready_path(200)].content or ""}
    again = make_plan(
        "kpro6", spec(), facts(ct=CT + f"hookscript: {HOOKSCRIPT_VOLID}\n", extra=done)
    )
    assert not again.readiness.hooks[("lxc", 200)].changes
    assert again.files[ready_path(200)].content == done[ready_path(200)]
    # Turned off: the user's own is back, gpuhost's files go.
    off = make_plan(
        "kpro6",
        spec(enabled=False),
        facts(ct=CT + f"hookscript: {HOOKSCRIPT_VOLID}\n", extra=done),
    )
    hook = off.readiness.hooks[("lxc", 200)]
    assert (hook.current, hook.wanted) == (HOOKSCRIPT_VOLID, own)
    assert off.files[ready_path(200)].content is None and off.files[HOOKSCRIPT].content is None
    assert ("qemu", 129) not in off.readiness.hooks  # never given one: never touched


def test_guests_without_gpus_are_never_touched_and_snippets_stay() -> None:
    with_snippets = STORAGE.replace("backup", "backup,snippets")
    plan = make_plan("kpro6", spec(), facts(storage=with_snippets, others=("300 hostname: web",)))
    assert ("lxc", 300) not in plan.readiness.hooks
    assert plan.readiness.snippets_content is None


def test_a_host_without_the_local_dir_storage_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="pvesm add dir local --path /var/lib/vz"):
        make_plan("kpro6", spec(), facts(storage="zfspool: local-zfs\n\tpool rpool/data\n"))


def test_storage_config_and_snippet_paths() -> None:
    cfg = storages(STORAGE + "\nnfs: shared\n\tserver 10.0.0.1\n\tcontent snippets\n")
    assert cfg["local"] == {"type": "dir", "path": "/var/lib/vz", "content": "iso,vztmpl,backup"}
    assert snippet_path("shared:snippets/x.pl", cfg) == "/mnt/pve/shared/snippets/x.pl"
    assert snippet_path("local:iso/x.iso", cfg) is None


# --- the hookscript against a temporary root ---------------------------------------------------


def host_root(tmp: Path, uvm_node: bool = True, version: str = "580.95.05") -> Path:
    """A root with what the script reads: /proc/devices, the driver's version and GPU
    information, the device nodes (regular files stand in for them: see _fake_nodes)."""
    root = tmp / "root"
    (root / "proc/driver/nvidia/gpus/0000:01:00.0").mkdir(parents=True)
    (root / "proc/devices").write_text(
        "Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n509 nvidia-uvm\n\n"
        "Block devices:\n  8 sd\n"
    )
    (root / "proc/driver/nvidia/version").write_text(
        f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build\n"
    )
    (root / "proc/driver/nvidia/gpus/0000:01:00.0/information").write_text(
        f"Model: \t\t NVIDIA H200\nGPU Firmware: \t {version}\n"
    )
    (root / "dev").mkdir()
    for name in ("nvidia0", "nvidiactl", *(("nvidia-uvm",) if uvm_node else ())):
        os.mknod(root / "dev" / name, stat.S_IFCHR | 0o666, os.makedev(*_numbers(name)))
    return root


def _numbers(name: str) -> tuple[int, int]:
    return {"nvidia0": (195, 0), "nvidiactl": (195, 255), "nvidia-uvm": (509, 0)}[name]


def contract(**over: object) -> dict[str, object]:
    body: dict[str, object] = {
        "version": 1,
        "guest": "CT 200 (ct200)",
        "kind": "lxc",
        "vmid": 200,
        "wait_s": 0,
        "unit": "gpuhost-nvidia-devices.service",
        "nodes": [
            {"path": "/dev/nvidia0", "device": "nvidia", "minor": 0, "major": None},
            {"path": "/dev/nvidiactl", "device": "nvidia", "minor": 255, "major": None},
            {"path": "/dev/nvidia-uvm", "device": "nvidia-uvm", "minor": 0, "major": None},
        ],
        "driver": "580.95.05",
        "gpus": ["0000:01:00.0"],
        "gsp": True,
        "persistenced": False,
        "fabricmanager": False,
        "chain": None,
    }
    body.update(over)
    return body


def run_hook(root: Path, body: dict[str, object] | None, phase: str = "pre-start"):
    ready = root / "etc/gpuhost/ready"
    ready.mkdir(parents=True, exist_ok=True)
    if body is not None:
        (ready / "200.json").write_text(json.dumps(body))
    env = {
        **os.environ,
        "GPUHOST_READY_ROOT": str(root),
        "PATH": f"{root / 'bin'}:/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, str(SCRIPT), "200", phase], capture_output=True, text=True, env=env
    )


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of character devices needs root")


@needs_root
def test_ready_guest_starts_fast(tmp_path: Path) -> None:
    root = host_root(tmp_path)
    started = time.monotonic()
    done = run_hook(root, contract())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "" and time.monotonic() - started < 2.0


@needs_root
@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"uvm_node": False}, "/dev/nvidia-uvm is missing; fix: systemctl restart"),
        ({"version": "595.71.05"}, "the host runs driver 595.71.05, the guest's NVIDIA userspace"),
    ],
)
def test_a_missing_part_refuses_the_start_in_one_line(
    tmp_path: Path, change: dict[str, object], words: str
) -> None:
    root = host_root(tmp_path, **change)  # type: ignore[arg-type]
    done = run_hook(root, contract())
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuhost-ready: CT 200 (ct200) not started: ")
    assert words in lines[0] and "pct start 200" in lines[0]


@needs_root
def test_stale_raw_major_gsp_and_vfio(tmp_path: Path) -> None:
    root = host_root(tmp_path)
    nodes = contract()["nodes"]
    stale = [dict(n, major=510 if n["device"] == "nvidia-uvm" else 195) for n in nodes]  # type: ignore[union-attr]
    done = run_hook(root, contract(nodes=stale))
    assert "raw rule grants /dev/nvidia-uvm as major 510" in done.stdout
    info = root / "proc/driver/nvidia/gpus/0000:01:00.0/information"
    info.write_text("GPU Firmware: \t N/A\n")
    assert "runs GSP firmware N/A" in run_hook(root, contract()).stdout
    assert run_hook(root, contract(gsp=False)).returncode == 0
    dev = root / "sys/bus/pci/devices/0000:c1:00.0"
    dev.mkdir(parents=True)
    (dev / "driver").symlink_to("../../../bus/pci/drivers/nvidia")
    vm = {"kind": "qemu", "guest": "VM 200", "vfio": ["0000:c1:00.0"], "mappings": []}
    done = run_hook(root, {**vm, "unit": None})
    assert (
        "0000:c1:00.0 is on nvidia, not vfio-pci" in done.stdout and "qm start 200" in done.stdout
    )


@needs_root
def test_waits_for_the_boot_unit_then_gives_up(tmp_path: Path) -> None:
    root = host_root(tmp_path, uvm_node=False)
    (root / "bin").mkdir()
    systemctl = root / "bin/systemctl"
    systemctl.write_text("#!/bin/sh\necho activating\n")
    systemctl.chmod(0o755)
    started = time.monotonic()
    done = run_hook(root, contract(wait_s=1))
    assert time.monotonic() - started >= 1.0
    assert done.returncode == 1 and "(waited for gpuhost-nvidia-devices.service: activating)" in (
        done.stdout
    )
    # After the boot an inactive unit is one whose condition failed: no wait.
    systemctl.write_text('#!/bin/sh\n[ "$1" = is-active ] && echo inactive || echo running\n')
    started = time.monotonic()
    done = run_hook(root, contract(wait_s=30))
    assert done.returncode == 1 and time.monotonic() - started < 10 and "waited" not in done.stdout


@needs_root
def test_the_users_hookscript_runs_for_every_phase_after_the_check(tmp_path: Path) -> None:
    root = host_root(tmp_path)
    log = tmp_path / "user.log"
    user = root / "var/lib/vz/snippets/mine.sh"
    user.parent.mkdir(parents=True)
    user.write_text(f'#!/bin/sh\necho "$1 $2" >> {log}\n[ "$2" != pre-start ] || exit 3\n')
    user.chmod(0o755)
    chain = {"volid": "local:snippets/mine.sh", "path": "/var/lib/vz/snippets/mine.sh"}
    done = run_hook(root, contract(chain=chain))
    assert done.returncode == 3  # the user's own pre-start failure still aborts the start
    assert run_hook(root, contract(chain=chain), "post-stop").returncode == 0
    assert log.read_text() == "200 pre-start\n200 post-stop\n"
    os.unlink(root / "dev/nvidia-uvm")
    assert run_hook(root, contract(chain=chain)).returncode == 1
    assert log.read_text() == "200 pre-start\n200 post-stop\n"  # not run when gpuhost refuses


def test_a_guest_without_a_contract_starts(tmp_path: Path) -> None:
    assert run_hook(tmp_path, None).returncode == 0


def test_a_vms_board_must_fit_its_mapping(tmp_path: Path) -> None:
    root = tmp_path / "root"
    dev = root / "sys/bus/pci/devices/0000:c1:00.0"
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x10de\n")
    (dev / "device").write_text("0x2bb1\n")
    (dev / "iommu_group").symlink_to("../../../../kernel/iommu_groups/12")
    (dev / "driver").symlink_to("../../../../bus/pci/drivers/vfio-pci")
    cfg = root / "etc/pve/mapping/pci.cfg"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(
        "gpuhost-0000-c1-00\n\tmap id=10de:2bb1,iommugroup=12,node=pve,path=0000:c1:00\n"
    )
    mapping = {"id": "gpuhost-0000-c1-00", "path": "0000:c1:00"}
    vm = {"kind": "qemu", "guest": "VM 200", "vfio": ["0000:c1:00.0"], "mappings": [mapping]}
    assert run_hook(root, vm).returncode == 0
    cfg.write_text(cfg.read_text().replace("iommugroup=12", "iommugroup=13"))
    assert "in IOMMU group 12, mapping gpuhost-0000-c1-00 names 13" in run_hook(root, vm).stdout
    cfg.write_text(cfg.read_text().replace("2bb1", "2335").replace("=13", "=12"))
    assert "board 0000:c1:00 is 10de:2bb1, mapping gpuhost-0000-c1-00 names 10de:2335" in (
        run_hook(root, vm).stdout
    )
    cfg.write_text("")
    assert "has no entry for 0000:c1:00" in run_hook(root, vm).stdout
