"""Hardware profiles: the shipped ones load; bad ones fail naming field, value and fix."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from twin.profile import PROFILES_DIR, ProfileError, load_profile, parse_profile


def data(name: str = "h200x2") -> dict:
    return yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())


@pytest.mark.parametrize("name", ["kpro6", "kpro6-pve9", "h200x2", "lumped", "sevsnp"])
def test_shipped_profiles_load(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert len(profile.topology.links) == len(profile.gpus)


def test_kpro6_is_eight_blackwell_gpus_each_alone() -> None:
    p = load_profile("kpro6")
    assert [g.name for g in p.gpus] == ["NVIDIA RTX PRO 6000 Blackwell Workstation Edition"] * 8
    devices = {d.bdf: d for d in p.pci_devices}
    assert {devices[g.bdf].vendor + ":" + devices[g.bdf].device for g in p.gpus} == {"10de:2bb1"}
    groups = [devices[g.bdf].iommu_group for g in p.gpus]
    assert len(set(groups)) == 8
    ports = [devices[g.bdf].parent for g in p.gpus]
    assert len(set(ports)) == 8 and all(devices[port].acs for port in ports)
    off_diagonal = {
        c for r, row in enumerate(p.topology.links) for c_i, c in enumerate(row) if r != c_i
    }
    assert off_diagonal == {"NODE", "SYS"}
    assert {c for m in p.topology.p2p.values() for row in m for c in row} == {"X", "NS"}
    assert (p.cpu.vendor, p.cpu.numa_nodes, p.boot.loader) == ("AMD", 2, "systemd-boot")


def test_kpro6_pve9_is_kpro6_after_the_upgrade() -> None:
    """The same machine: only the Proxmox release (and so the Debian base) and kernels differ."""
    old, new = load_profile("kpro6"), load_profile("kpro6-pve9")
    same = ("hostname", "cpu", "memory_gib", "boot", "pci_devices", "gpus", "topology", "nvidia")
    assert all(getattr(old, f) == getattr(new, f) for f in same)
    assert (old.pve, old.debian_suite, new.pve, new.debian_suite) == (8, "bookworm", 9, "trixie")
    assert [(k.version, k.gcc) for k in new.kernels] == [
        ("6.14.8-2-pve", "gcc (Debian 14.2.0-19) 14.2.0")
    ]


def test_pve_release_is_8_or_9() -> None:
    msg = err(lambda d: d.update(pve=7))
    assert "h200x2.yaml: pve=7: Input should be 8 or 9" in msg


def test_h200x2_matches_the_capture_identity() -> None:
    p = load_profile("h200x2")
    assert [g.bdf for g in p.gpus] == ["0000:00:06.0", "0000:00:07.0"]
    assert {g.memory_mib for g in p.gpus} == {143771}
    assert {g.vbios for g in p.gpus} == {"96.00.A5.00.1A"}
    assert p.topology.links == [["X", "NV18"], ["NV18", "X"]]


def err(mutate, name: str = "h200x2") -> str:
    d = copy.deepcopy(data(name))
    mutate(d)
    with pytest.raises(ProfileError) as exc:
        parse_profile(d, f"{name}.yaml")
    return str(exc.value)


def test_bad_bdf_names_field_value_and_fix() -> None:
    msg = err(lambda d: d["gpus"][1].update(bdf="00:07.0"))
    assert "h200x2.yaml: gpus[1].bdf='00:07.0'" in msg
    assert "write it like '0000:41:00.0'" in msg


def test_gpu_must_be_a_pci_device() -> None:
    msg = err(lambda d: d["gpus"][1].update(bdf="0000:00:08.0"))
    assert "gpus[1].bdf='0000:00:08.0' is not in pci_devices" in msg
    assert "add the device or fix the BDF" in msg


def test_unknown_field_is_refused() -> None:
    msg = err(lambda d: d["cpu"].update(vendr="AMD"))
    assert "cpu.vendr='AMD'" in msg


def test_matrix_must_be_symmetric_with_x_diagonal() -> None:
    msg = err(lambda d: d["topology"]["p2p"].update(r=[["X", "OK"], ["NS", "X"]]))
    assert "topology.p2p.r is not symmetric" in msg
    msg = err(lambda d: d["topology"].update(links=[["NV18", "NV18"], ["NV18", "X"]]))
    assert "topology.links[0][0]='NV18' is invalid" in msg


def test_cannot_mark_every_kernel_failing() -> None:
    msg = err(lambda d: d.update(failing_kernels=["6.8.12-9-pve"]))
    assert "keep one known-good kernel" in msg


def test_systemd_boot_needs_root_and_uefi() -> None:
    msg = err(lambda d: d["boot"].update(kernel_cmdline="quiet"))
    assert "must hold root=" in msg
    msg = err(lambda d: d["boot"].update(firmware="bios"))
    assert "use loader 'grub' for legacy BIOS" in msg


def test_kernel_gcc_text_is_checked() -> None:
    msg = err(lambda d: d["kernels"][0].update(gcc="gcc 12"))
    assert "kernels[0].gcc='gcc 12'" in msg and "gcc (Debian 12.2.0-14) 12.2.0" in msg


def test_unknown_profile_lists_known_ones() -> None:
    with pytest.raises(
        ProfileError,
        match=r"known profiles: \['h200x2', 'hgx-h200', 'kpro6', 'kpro6-pve9', 'lumped', 'sevsnp'\]",
    ):
        load_profile("nope")


def test_yaml_path_loads(tmp_path: Path) -> None:
    target = tmp_path / "mine.yaml"
    target.write_text((PROFILES_DIR / "lumped.yaml").read_text())
    assert load_profile(target).name == "lumped"
