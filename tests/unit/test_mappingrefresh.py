"""The refresh of gpuhost's PCI mappings' IOMMU groups: planned as a boot unit ordered before
pve-guests.service, and its shell run against a temporary /etc/pve and /sys."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpuhost.plan.guests.mappings import SCRIPT, UNIT, WANTS, refresh_command
from gpuhost.plan.guests.vms import PciMapping
from gpuhost.plan.make import make_plan
from gpuhost.spec.host import HostSpec
from tests.unit.hosts import kpro6

KPRO6 = {"kernel": {"version": "6.14.8-2-bpo12-pve"}, "driver": {"version": "595.71.05"}}
GPU = PciMapping("gpuhost-0000-c1-00", "0000:c1:00", "10de:2bb1", "10de:204b", 12)
OTHER = "id=10de:2bb1,iommugroup=7,node=pve2,path=0000:c1:00,subsystem-id=10de:204b"
PVESH = '#!/bin/sh\nprintf "%s\\n" "$@" > "$PVESH_ARGS"\n'


def spec(*guests: dict) -> HostSpec:
    return HostSpec.model_validate({**KPRO6, "guests": list(guests)})


def test_the_boot_unit_runs_before_the_guests_when_vms_have_gpus() -> None:
    vm = {"kind": "vm", "vmid": 129, "name": "vm129", "machine": "q35"}
    plan = make_plan("kpro6", spec({**vm, "gpus": ["0000:c1:00.0", "0000:e1:00.0"]}), kpro6())
    unit, script = plan.files[UNIT].content, plan.files[SCRIPT].content
    assert unit is not None and script is not None
    lines = unit.splitlines()
    # pve-manager services/pve-guests.service runs startall; /etc/pve is pve-cluster's
    assert "Before=pve-guests.service" in lines and "After=pve-cluster.service" in lines
    assert "Type=oneshot" in lines and f"ExecStart={SCRIPT}" in lines
    assert plan.files[WANTS].link == UNIT and plan.files[SCRIPT].mode == "755"
    for mapping in plan.vm_split.mappings.values():
        assert f"( {refresh_command(mapping)} ) || rc=1" in script.splitlines()
    assert len(plan.vm_split.mappings) == 2
    systemd = next(f for f in plan.follow_ups if f.name == "systemd")
    assert UNIT in systemd.triggers
    # the same before the VM exists (no mapping yet): the unit need not change when it is made
    before = make_plan(
        "kpro6",
        spec({**vm, "gpus": ["0000:c1:00.0", "0000:e1:00.0"]}),
        kpro6(PveGuestConfigs=(0, [])),
    )
    assert not before.vm_split.mappings and before.files[SCRIPT].content == script
    # without VM GPUs all three are planned absent
    none = make_plan(
        "kpro6",
        spec({"kind": "lxc", "ctid": 200, "name": "ct", "gpus": "rest"}),
        kpro6(PveGuestConfigs=(0, [])),
    )
    assert not any(none.files[p].present for p in (SCRIPT, UNIT, WANTS))


def run(tmp_path: Path, cfg: str, group: str | None) -> tuple[int, list[str] | None]:
    """The refresh command with /etc/pve and /sys under ``tmp_path``; pvesh's arguments."""
    pve = tmp_path / "etc/pve"
    (pve / "mapping").mkdir(parents=True)
    (pve / "mapping/pci.cfg").write_text(cfg)
    (pve / "local").symlink_to("nodes/pve1")
    device = tmp_path / "sys/bus/pci/devices/0000:c1:00.0"
    device.mkdir(parents=True)
    if group is not None:
        (device / "iommu_group").symlink_to(f"../../../../kernel/iommu_groups/{group}")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "pvesh").write_text(PVESH)
    (bindir / "pvesh").chmod(0o755)
    command = (
        refresh_command(GPU).replace("/etc/pve", str(pve)).replace("/sys/", f"{tmp_path}/sys/")
    )
    args = tmp_path / "pvesh.args"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PVESH_ARGS": str(args)}
    done = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True)
    return done.returncode, args.read_text().splitlines() if args.exists() else None


def test_this_nodes_entry_gets_the_live_group_and_other_nodes_keep_theirs(tmp_path) -> None:
    cfg = (
        f"gpuhost-0000-c1-00\n\tmap {OTHER}\n"
        "\tmap id=10de:2bb1,iommugroup=3,node=pve1,path=0000:c1:00,subsystem-id=10de:204b\n\n"
        "gpuhost-0000-e1-00\n\tmap id=10de:2bb1,node=pve3,path=0000:e1:00\n"
    )
    rc, args = run(tmp_path, cfg, "12")
    mine = "id=10de:2bb1,iommugroup=12,node=pve1,path=0000:c1:00,subsystem-id=10de:204b"
    assert rc == 0 and args == [
        "set", "/cluster/mapping/pci/gpuhost-0000-c1-00", "--map", OTHER, "--map", mine
    ]  # fmt: skip


def test_an_entry_with_the_live_group_is_left_alone(tmp_path) -> None:
    mine = "id=10de:2bb1,iommugroup=12,node=pve1,path=0000:c1:00,subsystem-id=10de:204b"
    rc, args = run(tmp_path, f"gpuhost-0000-c1-00\n\tmap {mine}\n", "12")
    assert (rc, args) == (0, None)


def test_without_a_group_the_entry_has_none(tmp_path) -> None:
    cfg = "gpuhost-0000-c1-00\n\tmap id=10de:2bb1,iommugroup=3,node=pve1,path=0000:c1:00\n"
    rc, args = run(tmp_path, cfg, None)
    mine = "id=10de:2bb1,node=pve1,path=0000:c1:00,subsystem-id=10de:204b"
    assert rc == 0 and args == ["set", "/cluster/mapping/pci/gpuhost-0000-c1-00", "--map", mine]


def test_a_mapping_not_made_yet_is_left_alone(tmp_path) -> None:
    cfg = "gpuhost-0000-e1-00\n\tmap id=10de:2bb1,node=pve1,path=0000:e1:00\n"
    assert run(tmp_path, cfg, "12") == (0, None)
