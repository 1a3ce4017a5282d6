"""proxmox-boot-tool, update-grub, update-initramfs and the boot snapshot (docs/reference/formats.md §5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.twin.pve_helpers import make_root, run, run_hook
from twin import pve
from twin.pve import boot_functions as bl

OLD, NEW = "6.8.12-9-pve", "6.14.8-2-bpo12-pve"
TOOL = "proxmox-boot-tool"


def bootcfg(root: Path) -> dict:
    return json.loads((root / bl.BOOTCFG).read_text())


@pytest.fixture
def esp(tmp_path: Path) -> Path:
    return make_root(tmp_path, "systemd-boot")


@pytest.fixture
def grub(tmp_path: Path) -> Path:
    return make_root(tmp_path, "grub")


def test_status_on_esp_host(esp: Path) -> None:
    rc, out, err = run(esp, TOOL, "status")
    assert (rc, err) == (0, "")
    assert out == (
        "Re-executing '/usr/sbin/proxmox-boot-tool' in new private mount namespace..\n"
        "System currently booted with uefi\n"
        f"9B1C-4F2A is configured with: uefi (versions: {NEW}, {OLD})\n"
    )
    assert run(esp, TOOL, "status", "--quiet") == (0, "", "")


def test_status_on_plain_grub_host(grub: Path) -> None:
    assert run(grub, TOOL, "status") == (
        2,
        "Re-executing '/usr/sbin/proxmox-boot-tool' in new private mount namespace..\n",
        "E: /etc/kernel/proxmox-boot-uuids does not exist.\n",
    )
    assert run(grub, TOOL, "status", "--quiet") == (2, "", "")


def test_kernel_list_and_pins(esp: Path) -> None:
    assert run(esp, TOOL, "kernel", "list") == (
        0,
        f"Manually selected kernels:\nNone.\n\nAutomatically selected kernels:\n{NEW}\n{OLD}\n",
        "",
    )
    rc, out, _ = run(esp, TOOL, "kernel", "pin", OLD)
    assert (rc, out) == (
        0,
        f"Set kernel '{OLD}' in /etc/kernel/proxmox-boot-pin. "
        "Use the 'refresh' command to update the ESPs.\n",
    )
    rc, out, _ = run(esp, TOOL, "kernel", "pin", NEW, "--next-boot")
    assert out.endswith("Pinned for next boot only.\n")
    assert (esp / "etc/kernel/next-boot-pin").read_text() == f"{NEW}\n"
    rc, out, _ = run(esp, TOOL, "kernel", "list")
    assert out.endswith(f"\n\nPinned kernel:\n{OLD}\n\nKernel pinned on next-boot:\n{NEW}\n")
    rc, out, _ = run(esp, TOOL, "kernel", "pin", NEW)
    assert out.startswith(f"Overriding previously pinned version '{OLD}' with '{NEW}'\n")


def test_pin_needs_an_installed_kernel(esp: Path) -> None:
    rc, out, err = run(esp, TOOL, "kernel", "pin", "6.17.1-1-pve")
    assert (rc, out) == (1, "")
    assert err == (
        "E: no kernel image found in /boot for '6.17.1-1-pve', not setting default.\n\n"
        f"Possible Proxmox kernel versions are:\n{NEW}\n{OLD}\n"
    )
    assert not (esp / "etc/kernel/proxmox-boot-pin").exists()
    assert run(esp, TOOL, "kernel", "pin")[0] == 1  # usage: no version
    assert run(esp, TOOL, "kernel", "frob")[2].startswith(
        "E: invalid 'kernel' subcommand 'frob'.\n"
    )


def test_snapshot_changes_only_on_refresh(esp: Path) -> None:
    assert bootcfg(esp)["kernel_default"] == NEW
    assert bootcfg(esp)["kernels"] == [OLD, NEW]  # oldest first (twin/boot.py's format)
    run(esp, TOOL, "kernel", "pin", OLD)
    (esp / "etc/kernel/cmdline").write_text("root=ZFS=rpool/ROOT/pve-1 boot=zfs amd_iommu=on\n")
    assert bootcfg(esp)["kernel_default"] == NEW  # not refreshed yet: the ESP is unchanged
    rc, out, err = run(esp, TOOL, "refresh")
    assert rc == 0
    assert out == (
        "Running hook script 'proxmox-auto-removal'..\n"
        "Running hook script 'zz-proxmox-boot'..\n"
        "Re-executing '/etc/kernel/postinst.d/zz-proxmox-boot' in new private mount namespace..\n"
    )
    assert err == (
        "Copying and configuring kernels on /dev/disk/by-uuid/9B1C-4F2A\n"
        f"\tCopying kernel and creating boot-entry for {NEW}\n"
        f"\tCopying kernel and creating boot-entry for {OLD}\n"
    )
    cfg = bootcfg(esp)
    assert cfg["kernel_default"] == OLD and cfg["next_boot_pin"] is None
    assert cfg["cmdline"] == "root=ZFS=rpool/ROOT/pve-1 boot=zfs amd_iommu=on"
    assert cfg["written_by"] == "proxmox-boot-tool refresh" and cfg["loader"] == "systemd-boot"


def test_next_boot_pin_is_the_loader_default_until_cleanup(esp: Path) -> None:
    run(esp, TOOL, "kernel", "pin", OLD)
    run(esp, TOOL, "kernel", "pin", NEW, "--next-boot")
    run(esp, TOOL, "refresh")
    # loader.conf `default proxmox-NEW.conf`: no one-shot (docs/reference/trial-boot.md §5)
    cfg = bootcfg(esp)
    assert (cfg["kernel_default"], cfg["kernel_pin"], cfg["next_boot_pin"]) == (NEW, OLD, NEW)
    assert json.loads((esp / bl.ESP_STATE).read_text())["9B1C-4F2A"]["default"] == (
        f"proxmox-{NEW}.conf"
    )
    out = pve.on_boot(esp)  # proxmox-boot-cleanup.service
    assert out.stdout[0] == "Removed /etc/kernel/next-boot-pin."
    assert not (esp / "etc/kernel/next-boot-pin").exists()
    cfg = bootcfg(esp)
    assert (cfg["kernel_default"], cfg["next_boot_pin"]) == (OLD, None)


def test_unpin(esp: Path) -> None:
    run(esp, TOOL, "kernel", "pin", OLD)
    assert run(esp, TOOL, "kernel", "unpin") == (
        0,
        "Removed /etc/kernel/next-boot-pin.\nRemoved /etc/kernel/proxmox-boot-pin.\n"
        f"Unpinned kernel '{OLD}'. Use the 'refresh' command to update the ESPs.\n",
        "",
    )


def test_refresh_refuses_cmdline_without_root(esp: Path) -> None:
    (esp / "etc/kernel/cmdline").write_text("quiet intel_iommu=on\n")
    rc, _, err = run(esp, TOOL, "refresh")
    assert (rc, err) == (1, "No root= parameter in /etc/kernel/cmdline found!\n")


def test_manual_kernels(esp: Path) -> None:
    assert run(esp, TOOL, "kernel", "add", OLD)[1] == (
        f"Added kernel '{OLD}' to manual kernel list. Use the 'refresh' command to update the ESPs.\n"
    )
    out = run(esp, TOOL, "kernel", "list")[1]
    assert out.startswith(
        f"Manually selected kernels:\n{OLD}\n\nAutomatically selected kernels:\n{NEW}\n"
    )
    assert "not found in manual kernel list" in run(esp, TOOL, "kernel", "remove", NEW)[1]


# --- GRUB hosts ---


def test_refresh_on_grub_host_skips_esp_sync(grub: Path) -> None:
    before = bootcfg(grub)
    rc, out, err = run(grub, TOOL, "refresh")
    assert rc == 0 and out.startswith("Running hook script 'proxmox-auto-removal'..\n")
    assert err == "No /etc/kernel/proxmox-boot-uuids found, skipping ESP sync.\n"
    assert bootcfg(grub) == before


def test_update_grub_reads_grub_d_and_writes_cfg(grub: Path) -> None:
    (grub / "etc/default/grub.d/iommu.cfg").write_text(
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT intel_iommu=on iommu=pt"\n'
    )
    assert bootcfg(grub)["cmdline"] == "root=/dev/mapper/pve-root ro quiet"
    rc, out, err = run(grub, "update-grub")
    assert (rc, out) == (0, "")
    assert err == (
        "Generating grub configuration file ...\n"
        f"Found linux image: /boot/vmlinuz-{NEW}\nFound initrd image: /boot/initrd.img-{NEW}\n"
        f"Found linux image: /boot/vmlinuz-{OLD}\nFound initrd image: /boot/initrd.img-{OLD}\n"
        "done\n"
    )
    grub_cfg = (grub / "boot/grub/grub.cfg").read_text()
    assert (
        f"linux\t/boot/vmlinuz-{NEW} root=/dev/mapper/pve-root ro quiet intel_iommu=on iommu=pt\n"
        in grub_cfg
    )
    cfg = bootcfg(grub)
    assert cfg["loader"] == "grub" and cfg["written_by"] == "update-grub"
    assert cfg["kernel_default"] == NEW
    assert cfg["cmdline"] == "root=/dev/mapper/pve-root ro quiet intel_iommu=on iommu=pt"


def test_grub_pin_runs_update_grub(grub: Path) -> None:
    rc, out, err = run(grub, TOOL, "kernel", "pin", OLD)
    assert rc == 0
    assert out == f"Setting '{OLD}' as grub default entry and running update-grub.\n"
    assert err.startswith("Generating grub configuration file ...\n")
    snippet = (grub / bl.GRUB_PIN_SNIPPET).read_text()
    assert snippet.startswith('GRUB_DEFAULT="gnulinux-advanced-')
    assert f">gnulinux-{OLD}-advanced-" in snippet
    assert bootcfg(grub)["kernel_default"] == OLD
    _rc, out, _ = run(grub, TOOL, "kernel", "unpin")
    assert out.endswith("Reset default grub entry and running update-grub.\n")
    assert not (grub / bl.GRUB_PIN_SNIPPET).exists()
    assert bootcfg(grub)["kernel_default"] == NEW


def test_grub_next_boot_pin(grub: Path) -> None:
    run(grub, TOOL, "kernel", "pin", OLD, "--next-boot")
    assert bootcfg(grub)["kernel_default"] == OLD  # GRUB_DEFAULT itself: sticky
    pve.on_boot(grub)
    assert not (grub / bl.GRUB_PIN_SNIPPET).exists()  # the cleanup resets GRUB_DEFAULT
    assert (bootcfg(grub)["kernel_default"], bootcfg(grub)["next_boot_pin"]) == (NEW, None)


# --- update-initramfs ---


def test_update_initramfs_records_module_config_and_syncs_esp(esp: Path) -> None:
    modprobe = esp / "etc/modprobe.d"
    modprobe.mkdir(parents=True)
    (modprobe / "nvidia-uvm.conf").write_text("options nvidia_uvm uvm_disable_hmm=1\n")
    rc, out, err = run(esp, "update-initramfs", "-u", "-k", OLD)
    assert rc == 0
    assert out.startswith(f"update-initramfs: Generating /boot/initrd.img-{OLD}\n")
    assert "Running hook script 'zz-proxmox-boot'..\n" in out  # proxmox-boot-sync
    assert err.startswith("Copying and configuring kernels on /dev/disk/by-uuid/9B1C-4F2A\n")
    record = json.loads((esp / f"boot/initrd.img-{OLD}").read_text())
    assert record["files"] == {
        "/etc/modprobe.d/nvidia-uvm.conf": "options nvidia_uvm uvm_disable_hmm=1\n"
    }
    assert bootcfg(esp)["initrd"][OLD]["sha256"] == record["sha256"]
    assert bootcfg(esp)["initrd"][NEW]["sha256"] != record["sha256"]  # not regenerated


def test_update_initramfs_defaults_and_all(esp: Path) -> None:
    out = run(esp, "update-initramfs", "-u")[1]
    assert out.startswith(f"update-initramfs: Generating /boot/initrd.img-{NEW}\n")  # newest only
    out = run(esp, "update-initramfs", "-u", "-k", "all")[1]
    assert out.count("update-initramfs: Generating") == 2
    rc, _, err = run(esp, "update-initramfs", "-u", "-k", "6.17.1-1-pve")
    assert (rc, err) == (0, "/boot/initrd.img-6.17.1-1-pve does not exist. Cannot update.\n")
    assert run(esp, "update-initramfs")[0] == 2


def test_kernel_without_initrd_is_not_bootable(esp: Path) -> None:
    (esp / "boot/vmlinuz-6.17.1-1-pve").write_text("kernel\n")
    _rc, _, err = run(esp, TOOL, "refresh")
    assert "No initrd-image /boot/initrd.img-6.17.1-1-pve found - skipping\n" in err
    assert "6.17.1-1-pve" not in bootcfg(esp)["kernels"]
    run(esp, "update-initramfs", "-c", "-k", "6.17.1-1-pve")
    assert bootcfg(esp)["kernels"][-1] == "6.17.1-1-pve"
    assert "6.17.1-1-pve" in run(esp, TOOL, "status")[1]


def test_install_with_real_profiles(tmp_path: Path) -> None:
    from twin.profile import load_profile

    for name in ("kpro6", "lumped"):
        root = tmp_path / name
        (root / "boot").mkdir(parents=True)
        profile = load_profile(name)
        for kernel in profile.kernels:
            (root / f"boot/vmlinuz-{kernel.version}").write_text("kernel\n")
        pve.install(root, profile)
        assert bootcfg(root)["loader"] == profile.boot.loader
        assert bootcfg(root)["kernels"][-1] == profile.kernels[-1].version


def test_update_grub_on_esp_host_does_not_change_what_boots(esp: Path) -> None:
    before = bootcfg(esp)
    assert run(esp, "update-grub")[0] == 0
    assert (esp / "boot/grub/grub.cfg").exists()
    assert bootcfg(esp) == before


def test_kernel_package_hooks_build_initrd_and_sync(esp: Path) -> None:
    """`dpkg -i proxmox-kernel-...deb` runs run-parts /etc/kernel/postinst.d <version> <image>."""
    new = "6.17.1-1-pve"
    (esp / f"boot/vmlinuz-{new}").write_text("kernel\n")
    (esp / "proc/sys/kernel").mkdir(parents=True)
    (esp / "proc/sys/kernel/osrelease").write_text(f"{OLD}\n")  # the running kernel is kept
    hooks = sorted(p.name for p in (esp / "etc/kernel/postinst.d").iterdir())
    assert hooks == ["initramfs-tools", "proxmox-auto-removal", "zz-proxmox-boot"]
    outputs = [run_hook(esp, "postinst", name, new) for name in hooks]
    assert all(res.returncode == 0 for res in outputs)
    assert outputs[0].stderr == f"update-initramfs: Generating /boot/initrd.img-{new}\n"
    assert outputs[2].stdout.startswith("Re-executing '/etc/kernel/postinst.d/zz-proxmox-boot'")
    assert f"\tCopying kernel and creating boot-entry for {new}\n" in outputs[2].stderr
    assert bootcfg(esp)["kernels"] == [OLD, NEW, new]  # latest two + the running one
    (esp / "proc/sys/kernel/osrelease").write_text(f"{new}\n")
    assert f"\tRemoving old version {OLD}\n" in run(esp, TOOL, "refresh")[2]
    assert bootcfg(esp)["kernels"] == [NEW, new]


def test_grub_host_kernel_hook_runs_update_grub(grub: Path) -> None:
    assert (grub / "etc/kernel/postinst.d/zz-update-grub").exists()
    (grub / "boot/vmlinuz-6.17.1-1-pve").write_text("kernel\n")
    run_hook(grub, "postinst", "initramfs-tools", "6.17.1-1-pve")
    res = run_hook(grub, "postinst", "zz-update-grub", "6.17.1-1-pve")
    assert res.stderr.startswith("Generating grub configuration file ...\n")
    assert bootcfg(grub)["kernel_default"] == "6.17.1-1-pve"  # GRUB_DEFAULT=0: the newest
