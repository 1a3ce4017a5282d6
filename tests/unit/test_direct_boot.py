"""Direct kernel boot (twin/profile_boot.py boot.loader none, twin/kernel_direct.py): the
converter picks it where the capture shows no boot loader, the profile checks it, and the twin's
boot starts the hypervisor's kernel with its command line whatever the machine's files say."""

import copy
import json
from pathlib import Path

import pytest

from gpuhost.observe.hostfacts import read_snapshot
from twin import boot, hwsim, kernel_direct
from twin.fromcapture import profile_from_snapshot
from twin.kernel_choice import START_KERNEL, BrickedError
from twin.profile import ProfileError, parse_profile

ROOT = Path(__file__).resolve().parents[2]
H200X1 = ROOT / "tests/fixtures/captures/h200x1/facts"
H200X2 = ROOT / "tests/fixtures/captures/h200x2/facts"


def made(path: Path, raw: dict | None = None) -> dict:
    raw = raw if raw is not None else read_snapshot(path)
    return profile_from_snapshot(raw, name=path.parent.name, source=str(path))


def test_h200x2_without_bootpath_is_direct_by_its_command_line():
    """h200x2's snapshot predates BootPath: no proxmox-boot-tool and a /proc/cmdline without
    a loader's word make it direct boot too, said in `assumed`."""
    data = made(H200X2)
    assert data["boot"]["loader"] == "none" and data["boot"]["firmware"] == "bios"
    assert any(line.startswith("boot.loader: none") for line in data["assumed"])


def test_a_capture_with_a_loader_is_not_direct():
    raw = read_snapshot(H200X1)
    rc, lines = raw["BootPath"]
    grub = copy.deepcopy(raw)
    grub["BootPath"] = (rc, [*lines, "grubfs /dev/mapper/pve-root ext4"])
    assert made(H200X1, grub)["boot"]["loader"] == "grub"
    uefi = copy.deepcopy(raw)
    uefi["BootPath"] = (rc, ["uefi yes", *lines[1:]])
    assert made(H200X1, uefi)["boot"]["loader"] == "grub"
    old = copy.deepcopy(read_snapshot(H200X2))
    rc, words = old["KernelCmdline"]
    old["KernelCmdline"] = (rc, ["BOOT_IMAGE=/boot/vmlinuz-6.8.12-9-pve " + words[0]])
    assert made(H200X2, old)["boot"]["loader"] == "grub"


def test_a_module_tree_without_a_boot_image_is_no_installed_kernel():
    """/lib/modules/<release> with only headers (build/.config) and no System.map in /boot: a
    removed kernel's leftovers, or a twin base's headers, are not kernels of the profile."""
    raw = copy.deepcopy(read_snapshot(H200X1))
    raw["KernelFeatureFiles"] = (0, ["kernel 6.1.0-50-amd64 zfs=0 acs=?"])
    rc, lines = raw["KernelCompilers"]
    raw["KernelCompilers"] = (
        rc,
        [
            "== kernel 6.1.0-50-amd64 build",
            'CONFIG_CC_VERSION_TEXT="gcc-12 (Debian 12.2.0-14) 12.2.0"',
            *lines,
        ],
    )
    assert [k["version"] for k in made(H200X1, raw)["kernels"]] == ["6.18.44-fc-v973-gpu"]
    # with a System.map (acs read) or /boot/config-* it is installed
    raw["KernelFeatureFiles"] = (0, ["kernel 6.1.0-50-amd64 zfs=0 acs=0"])
    assert "6.1.0-50-amd64" in [k["version"] for k in made(H200X1, raw)["kernels"]]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"boot": {"kernel": None}}, "needs boot.kernel"),
        ({"boot": {"esp_uuids": ["9B1C-4F2A"]}}, "remove boot.esp_uuids"),
        (
            {"boot": {"default_grub": "GRUB_DEFAULT=0\n"}},
            "remove boot.esp_uuids and boot.default_grub",
        ),
        ({"boot": {"kernel": "6.8.12-9-pve"}}, "is not in kernels"),
        ({"start": {"cmdline": "quiet"}}, "start.cmdline differs"),
        ({"start": {"running_kernel": "6.8.12-9-pve"}}, "start.running_kernel="),
    ],
)
def test_a_direct_boot_profile_names_what_is_wrong(change, message):
    data = made(H200X1)
    for section, values in change.items():
        data[section] = {**data[section], **values}
    with pytest.raises(ProfileError, match=message):
        parse_profile(data)
    grub = made(H200X1) | {"boot": {"firmware": "bios", "loader": "grub", "kernel": "6.1.0-1-x",
                                    "default_grub": "GRUB_DEFAULT=0\n"}}  # fmt: skip
    with pytest.raises(ProfileError, match=r"is for boot\.loader='none'"):
        parse_profile(grub)


def _hw(tmp_path: Path, profile) -> hwsim.Hw:
    boot.write_profile(tmp_path, profile)  # what hwsim.Hw reads
    hw = hwsim.Hw(tmp_path)
    hw.state = {}
    return hw


def test_the_hypervisor_boots_its_kernel_whatever_the_machine_says(tmp_path):
    profile = parse_profile(made(H200X1))
    hw = _hw(tmp_path, profile)
    # a pin, a one-shot, GRUB files, another kernel in /boot: none of it is read
    for rel, text in {
        "etc/kernel/proxmox-boot-pin": "6.8.12-9-pve\n",
        "boot/vmlinuz-6.8.12-9-pve": "image\n",
        "boot/grub/grubenv": "next_entry=gpuhost-trial\n",
        "etc/default/grub": 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n',
        START_KERNEL: "6.8.12-9-pve\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for _ in range(2):  # every boot the same
        kernel, cmdline, attempts = kernel_direct.choose(hw, profile)
        assert (kernel, cmdline) == (profile.boot.kernel, profile.boot.kernel_cmdline)
        assert attempts == [{"kernel": kernel, "result": "booted"}]
    assert not (tmp_path / START_KERNEL).exists()


def test_a_panicking_direct_kernel_loops(tmp_path):
    data = made(H200X1)
    data["failing_kernels"] = [data["boot"]["kernel"]]
    data["kernels"].append({**data["kernels"][0], "version": "6.18.45-fc-good"})
    profile = parse_profile(data)
    hw = _hw(tmp_path, profile)
    hw.save = lambda: None  # type: ignore[method-assign]
    with pytest.raises(BrickedError, match="hypervisor keeps booting"):  # panic=1 on its line
        kernel_direct.choose(hw, profile)
    assert "Kernel panic" in json.dumps(hw.state["panic_log"])
