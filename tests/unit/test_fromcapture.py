"""twin/fromcapture.py: profiles made from real captures carry what the capture says (read by
gpuhost's own parsers), list what they assumed, and never carry a secret."""

import base64
from pathlib import Path

import pytest
import yaml

from gpuhost.observe.hostfacts import parse_raw, read_snapshot
from twin.fromcapture import CaptureError, profile_from_snapshot, write_profile
from twin.fromcapture_secrets import REDACTED, redact, secret_path
from twin.profile import load_profile, parse_profile
from twin.rehearse_setup import keep_snapshot

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = {
    "kpro6": ROOT / "examples/kpro6-facts",
    "h200x1": ROOT / "tests/fixtures/captures/h200x1/facts",
    "h200x2": ROOT / "tests/fixtures/captures/h200x2/facts",
}


def made(name: str, raw: dict | None = None) -> dict:
    raw = raw if raw is not None else read_snapshot(CAPTURES[name])
    return profile_from_snapshot(raw, name=name, source=str(CAPTURES[name]))


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_profile_validates_and_carries_the_hardware(name):
    raw = read_snapshot(CAPTURES[name])
    facts = parse_raw(raw)
    data = made(name, raw)
    profile = parse_profile(data, name)
    # every PCI device with its ids, class, NUMA node, parent and IOMMU group
    devices = {d.bdf: d for d in profile.pci_devices}
    assert set(devices) == set(facts.pci)
    for bdf, dev in facts.pci.items():
        got = devices[bdf]
        assert (got.vendor, got.device, got.class_code) == (dev.vendor, dev.device, dev.class_code)
        assert (got.subsystem_vendor, got.subsystem_device) == (
            dev.subsystem_vendor,
            dev.subsystem_device,
        )
        assert got.numa_node == (-1 if dev.numa_node is None else dev.numa_node)
        assert (got.parent, got.iommu_group) == (dev.parent, dev.iommu_group)
    groups: dict[int, list[str]] = {}
    for dev in profile.pci_devices:
        if dev.iommu_group is not None:
            groups.setdefault(dev.iommu_group, []).append(dev.bdf)
    assert {g: sorted(m) for g, m in groups.items()} == facts.iommu_groups
    # GPUs: BDF, name, memory, UUID, VBIOS in nvidia-smi's order; the matrices as captured
    assert [
        (g.bdf, g.name, g.memory_mib, g.uuid, g.vbios, g.compute_cap) for g in profile.gpus
    ] == [(g.bdf, g.name, g.memory_mib, g.uuid, g.vbios, g.compute_cap) for g in facts.gpus.gpus]
    names = [f"GPU{i}" for i in range(len(profile.gpus))]
    for r, a in enumerate(names):
        for c, b in enumerate(names):
            assert profile.topology.links[r][c] == facts.topology.links[(a, b)]
            for mode in ("r", "w"):
                assert profile.topology.p2p[mode][r][c] == facts.p2p[mode][(a, b)]
        assert profile.gpus[r].cpu_affinity == facts.topology.cpu_affinity[a]
    # the running kernel and its compiler; the driver; the majors of its first boot
    running = profile.kernel(facts.kernel.release)
    assert running is not None and running.gcc == facts.kernel.compiler
    assert profile.start.running_kernel == facts.kernel.release
    assert profile.start.cmdline.split() == facts.cmdline
    assert (profile.start.driver.version, profile.start.driver.open) == (
        facts.driver.version,
        facts.driver.open,
    )
    assert profile.nvidia.first_boot_majors == {
        n: facts.char_devices[n] for n in ("nvidia-uvm", "nvidia-caps")
    }
    assert {line.split(None, 1)[1] for line in profile.char_devices} == {
        n for n in facts.char_devices if not n.startswith("nvidia")
    }
    assert profile.source == str(CAPTURES[name])
    assert profile.assumed and all(isinstance(line, str) and line for line in profile.assumed)


def test_kpro6_boot_kernels_and_guests():
    raw = read_snapshot(CAPTURES["kpro6"])
    facts = parse_raw(raw)
    profile = parse_profile(made("kpro6", raw))
    assert profile.boot.loader == "systemd-boot" and profile.boot.firmware == "uefi"
    assert profile.boot.esp_uuids == [uuid for uuid, _, _ in facts.boot_tool.esps]
    assert profile.boot.kernel_cmdline == facts.files["/etc/kernel/cmdline"].splitlines()[0]
    assert profile.start.files["/etc/kernel/cmdline"] == facts.files["/etc/kernel/cmdline"]
    assert sorted(k.version for k in profile.kernels) == facts.boot_kernels.all
    assert profile.quirks.sev_snp == facts.sev.snp_host
    assert profile.start.packages is None  # proxmox-boot-tool there, no HostRelease: not known
    # an older ConfigFiles (no ModuleConfigFiles beside it) did not read /etc/pve's files
    assert "/etc/kernel/cmdline" in profile.start.exact
    assert not [glob for glob in profile.start.exact if glob.startswith("/etc/pve/")]
    assert [(g.kind, g.vmid) for g in profile.start.guests] == sorted(facts.guest_configs)
    assert profile.start.driver.loaded == [m for m in facts.loaded_modules if "nvidia" in m]
    # Blackwell's FSP quirk follows the architecture (the hand-made kpro6.yaml has it too)
    assert all(g.fsp_fails_on_identity for g in profile.gpus)


def test_h200x1_says_what_it_assumed():
    raw = read_snapshot(CAPTURES["h200x1"])
    facts = parse_raw(raw)
    profile = parse_profile(made("h200x1", raw))
    # no loader on the Firecracker microVM (BootPath: uefi no, no ESP list, no /boot/grub;
    # BootTool 127): direct kernel boot of the running kernel with /proc/cmdline as it was,
    # init's arguments after "--" included; nothing about the loader is assumed
    assert (profile.boot.firmware, profile.boot.loader, profile.boot.root_fs) == (
        "bios",
        "none",
        "ext4",
    )
    assert profile.boot.kernel == facts.kernel.release == profile.start.running_kernel
    assert profile.boot.kernel_cmdline == " ".join(facts.cmdline) == profile.start.cmdline
    assert profile.boot.esp_uuids == [] and profile.boot.default_grub is None
    assert not [line for line in profile.assumed if line.startswith("boot.")]
    assert profile.kernels[0].gcc == "gcc (GCC) 15.3.0" and not profile.kernels[0].zfs
    # KernelFeatureFiles read every /lib/modules/*/ and found none: the microVM's kernel has no
    # module tree (h200x1-boot-raw/ls_modules.out), so no in-tree module can load on its twin
    assert facts.kernel_features.kernels == {} and not profile.kernels[0].in_tree_modules
    assert profile.start.os_release == {
        "ID": "ubuntu",
        "VERSION_ID": "24.04",
        "VERSION_CODENAME": "noble",
    }
    assert profile.start.packages == {} and profile.start.guests == []
    assert profile.start.driver.loaded == ["nvidia_uvm", "nvidia"]
    assert facts.module_config is not None and profile.start.files == {}
    # both file facts were captured: the twin keeps nothing there the capture did not hold
    assert "/etc/modprobe.d/*.conf" in profile.start.exact
    assert "/etc/modprobe.d/gpuhost-*.conf" in profile.start.exact
    assert "/etc/pve/storage.cfg" in profile.start.exact  # a snapshot new enough to read it
    assert profile.zfs_pools == []


def test_h200x2_is_close_to_the_hand_made_profile():
    """h200x2.yaml was written by hand from the raw capture of the same machine kind; what
    differs is what the facts snapshot does not hold (nvidia-smi -q's board fields, lspci's
    revision and modules, lscpu's hypervisor), the UUIDs (another machine of the kind, 47
    minutes later) and the boot loader (the hand-made one chose systemd-boot)."""
    hand = load_profile("h200x2")
    profile = parse_profile(made("h200x2"))
    assert [d.bdf for d in profile.pci_devices] == [d.bdf for d in hand.pci_devices]
    for ours, theirs in zip(profile.pci_devices, hand.pci_devices, strict=True):
        assert ours.model_dump(include={"vendor", "device", "class_code", "numa_node"}) == (
            theirs.model_dump(include={"vendor", "device", "class_code", "numa_node"})
        )
    keep = {"bdf", "name", "architecture", "memory_mib", "vbios", "compute_cap", "cpu_affinity"}
    assert [g.model_dump(include=keep | {"numa_affinity", "irq"}) for g in profile.gpus] == [
        g.model_dump(include=keep | {"numa_affinity", "irq"}) for g in hand.gpus
    ]
    assert profile.topology == hand.topology
    # no HostRelease in this older capture, but no proxmox-boot-tool either: no Proxmox VE
    assert profile.start.packages == {}
    assert profile.start.exact == []  # nor any file fact
    # no LoadedModules either: the modules with live parameters, and nvidia whose version it read
    assert profile.start.driver.loaded == ["nvidia_uvm", "nvidia"]
    assert profile.nvidia.model_dump(exclude={"fixed_majors"}) == hand.nvidia.model_dump(
        exclude={"fixed_majors"}
    )
    # gpuhost's /proc/devices parser keys majors by name: a name listed twice keeps its last
    assert set(profile.char_devices) < set(hand.char_devices)
    assert set(hand.char_devices) - set(profile.char_devices) == {
        "231 infiniband_mad",
        "231 infiniband_verbs",
    }


def test_write_profile_round_trips(tmp_path):
    data = made("kpro6")
    path = tmp_path / "kpro6-capture.yaml"
    write_profile(data, path)
    text = path.read_text()
    assert (
        text.startswith("# Twin profile 'kpro6'") and str(CAPTURES["kpro6"]) in text.splitlines()[0]
    )
    assert load_profile(path) == parse_profile(data)
    assert yaml.safe_load(text) == data


def _file_line(path: str, text: str) -> str:
    return f"F {path} {base64.b64encode(text.encode()).decode()}"


TOKEN = "8c0e3a52-51b6-4d1c-b2f6-9e77c1f0a1d4"


def planted_secrets() -> dict:
    """kpro6's snapshot with secrets planted: token and key files, secret-named entries in a
    kept file and in a container's config."""
    raw = read_snapshot(CAPTURES["kpro6"])
    token = TOKEN
    status, lines = raw["ConfigFiles"]
    raw["ConfigFiles"] = (
        status,
        [
            *lines,
            _file_line("/etc/gpuhost/api-token", f"root@pam!gpuhost={token}\n"),
            _file_line("/etc/gpuhost/proxmox.key", f"{token}\n"),
            _file_line("/etc/gpuhost/env.conf", f"USER=root\nPVE_API_TOKEN={token}\n"),
        ],
    )
    status, lines = raw["PveGuestConfigs"]
    raw["PveGuestConfigs"] = (
        status,
        [
            *lines,
            "==> /etc/pve/lxc/250.conf <==",
            "arch: amd64",
            "hostname: secretive",
            f"lxc.environment: HF_TOKEN={token}",
            f"lxc.environment = DB_PASSWORD={token}",
            "ostype: debian",
        ],
    )
    return raw


def test_secrets_never_enter_a_profile(tmp_path):
    token = TOKEN
    data = made("kpro6", planted_secrets())
    write_profile(data, tmp_path / "p.yaml")
    assert token not in (tmp_path / "p.yaml").read_text()
    start = parse_profile(data).start
    assert "/etc/gpuhost/api-token" not in start.files
    assert "/etc/gpuhost/proxmox.key" not in start.files
    assert start.files["/etc/gpuhost/env.conf"] == f"USER=root\nPVE_API_TOKEN={REDACTED}\n"
    guest = next(g for g in start.guests if g.vmid == 250)
    assert f"lxc.environment: HF_TOKEN={REDACTED}" in guest.config
    assert f"DB_PASSWORD={REDACTED}" in guest.config and "hostname: secretive" in guest.config
    assert any("left out as secret" in line for line in data["assumed"])


def test_the_snapshot_kept_beside_a_rehearsal_holds_no_secret_and_makes_the_same_profile(
    tmp_path,
):
    raw = planted_secrets()
    kept = keep_snapshot(tmp_path, raw)
    assert not any(TOKEN in f.read_text() for f in kept.iterdir())
    for key in ("ConfigFiles", "PveGuestConfigs"):  # and nothing of them in base64 either
        assert (
            base64.b64encode(TOKEN.encode()).decode()[:20] not in (kept / f"{key}.out").read_text()
        )
    assert "/etc/gpuhost/api-token" not in (kept / "ConfigFiles.out").read_text()
    again, first = made("kpro6", read_snapshot(kept)), made("kpro6", raw)
    # the same profile; only the line that says which secret files the first read had is gone
    secret_note = [line for line in first.pop("assumed") if "left out as secret" in line]
    assert secret_note and again.pop("assumed") == [
        line for line in made("kpro6", raw)["assumed"] if line not in secret_note
    ]
    assert again == first


def test_redaction_rule():
    assert secret_path("/etc/pve/priv/token.cfg") and secret_path("/etc/ssl/private/x.pem")
    assert not secret_path("/etc/gpuhost/ready/101.json") and not secret_path("/etc/kernel/cmdline")
    assert redact("net0: name=eth0,bridge=vmbr0\nhookscript: local:snippets/gpuhost-ready") == (
        "net0: name=eth0,bridge=vmbr0\nhookscript: local:snippets/gpuhost-ready"
    )
    assert redact('PASSWORD="a b" X=1') == f'PASSWORD="{REDACTED}" X=1'
    assert redact('{"token_secret": "abc-1", "node": "pve1"}') == (
        f'{{"token_secret": "{REDACTED}", "node": "pve1"}}'
    )
    assert redact("password: hunter2 # the root one") == f"password: {REDACTED}"
    assert redact("cipassword: $5$salt$hash more") == f"cipassword: {REDACTED}"
    assert redact("url: https://user:pw@example.invalid/x") == "url: https://***@example.invalid/x"


def test_bad_captures_name_the_fact_and_the_fix():
    raw = read_snapshot(CAPTURES["h200x2"])
    del raw["PciDevices"]
    with pytest.raises(CaptureError, match=r"lacks the facts PciDevices; capture the host again"):
        made("h200x2", raw)
    raw = read_snapshot(CAPTURES["h200x2"])
    raw["KernelBuildInfo"] = (0, ["not a kernel"])
    with pytest.raises(CaptureError, match=r"/proc/version.*capture the host again"):
        made("h200x2", raw)
    raw = read_snapshot(CAPTURES["kpro6"])
    secret = base64.b64encode(b"\xff" + b"token=8c0e3a52-51b6-4d1c-b2f6-9e77c1f0a1d4" * 4).decode()
    raw["ConfigFiles"] = (0, [f"F /etc/gpuhost/x {secret}"])
    with pytest.raises(CaptureError, match=r"managed files: not base64 text") as bad:
        made("kpro6", raw)
    assert secret not in str(bad.value) and "characters)" in str(bad.value)
    raw = read_snapshot(CAPTURES["h200x2"])
    raw["PciDevices"] = (0, [])
    with pytest.raises(CaptureError, match=r"fact PciDevices is empty"):
        made("h200x2", raw)
    raw = read_snapshot(CAPTURES["h200x2"])
    raw["KernelCmdline"] = (1, ["cat: /proc/cmdline: Permission denied"])
    with pytest.raises(CaptureError, match=r"fact KernelCmdline failed with exit status 1"):
        made("h200x2", raw)


def test_a_capture_without_the_driver_names_its_gpus_from_the_pci_ids():
    raw = read_snapshot(CAPTURES["h200x2"])
    for key in ("NvidiaGpus", "NvidiaTopology", "NvidiaP2P-r", "NvidiaP2P-w"):
        raw[key] = (127, [])
    raw["NvidiaDriver"] = (0, [])
    raw["NvidiaGpuInformation"] = (0, [])
    profile = parse_profile(made("h200x2", raw))
    assert [(g.name, g.memory_mib, g.architecture) for g in profile.gpus] == [
        ("NVIDIA H200", 143771, "Hopper")
    ] * 2
    assert profile.start.driver is None
    assert any(line.startswith("gpus[*].memory_mib") for line in profile.assumed)
