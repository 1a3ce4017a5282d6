"""True one-shots on the twin's boot loaders (docs/reference/trial-boot.md): systemd-boot's LoaderEntryOneShot,
GRUB's next_entry on ESPs and on LVM, proxmox-boot-tool's sticky --next-boot, panic=N."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from twin import boot, pve
from twin import hwtesting as ht
from twin.hardware import add_kernel
from twin.hwsim import efivars, grubenv
from twin.hwtesting import read, refresh, state
from twin.kernel_choice import ESP_DIR
from twin.profile import Boot, Kernel, Profile, load_profile
from twin.pve import cli

OLD, NEW = "6.8.12-9-pve", "6.14.8-2-bpo12-pve"
BAD = "6.14.11-9-pve"  # kpro6 lists it in failing_kernels
GUID = efivars.LOADER_GUID
ZFS = "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet"
GRUB_TEXT = 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX="panic=10"\n'


def kpro6(**changes: object) -> Profile:
    prof = load_profile("kpro6")
    quirks = prof.quirks.model_copy(update=changes)
    return prof.model_copy(update={"quirks": quirks})


def grub_profile(on_esp: bool) -> Profile:
    boot_ = Boot(firmware="bios", loader="grub", default_grub=GRUB_TEXT, grub_on_esp=on_esp)
    return load_profile("kpro6").model_copy(update={"boot": boot_})


def with_bad_kernel(root: Path) -> None:
    add_kernel(
        root, Kernel(version=BAD, gcc="gcc (Debian 12.2.0-14+deb12u1) 12.2.0"), headers=False
    )


def bootctl(root: Path, *args: str) -> tuple[int, str, str]:
    res = ht.run(root, "bootctl", *args)
    return res.returncode, res.stdout, res.stderr


def var(root: Path, name: str) -> bytes | None:
    path = root / f"sys/firmware/efi/efivars/{name}-{GUID}"
    return path.read_bytes() if path.exists() else None


# --- systemd-boot ---


def test_oneshot_is_consumed_on_systemd_boot(tmp_path: Path) -> None:
    prof = kpro6()
    root = ht.make_root(tmp_path, prof)
    refresh(root, kernel_default=OLD)  # loader.conf `default proxmox-OLD.conf`
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD
    assert var(root, "LoaderInfo") is not None
    assert bootctl(root, "set-oneshot", f"proxmox-{NEW}.conf") == (0, "", "")
    # efivarfs: 4 attribute bytes (NV|BS|RT) + UTF-16LE with a trailing NUL
    assert var(root, "LoaderEntryOneShot") == b"\x07\0\0\0" + f"proxmox-{NEW}.conf\0".encode(
        "utf-16-le"
    )
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == NEW
    assert var(root, "LoaderEntryOneShot") is None  # deleted on read
    assert efivars.read_string(root, "LoaderEntrySelected") == f"proxmox-{NEW}.conf"
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD


def test_oneshot_needs_the_exact_id_and_default_var_overrides_loader_conf(tmp_path: Path) -> None:
    prof = kpro6()
    root = ht.make_root(tmp_path, prof)
    refresh(root, kernel_default=OLD)
    ht.boot_root(root, prof)
    assert bootctl(root, "set-oneshot", f"proxmox-{NEW}")[0] == 0  # no check that it exists
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD  # matched nothing: the default, one-shot still consumed
    assert var(root, "LoaderEntryOneShot") is None
    bootctl(root, "set-default", f"proxmox-{NEW}.conf")
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == NEW
    bootctl(root, "set-default", "")
    assert var(root, "LoaderEntryDefault") is None
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD


def test_bootctl_refuses_without_uefi_or_loader(tmp_path: Path) -> None:
    prof = kpro6()
    root = ht.make_root(tmp_path, prof)
    (root / "sys/firmware/efi/efivars").mkdir(parents=True)
    assert bootctl(root, "set-oneshot", "x.conf") == (
        1,
        "",
        "Not booted with a supported boot loader.\n",
    )
    grub = ht.make_root(tmp_path / "grub", grub_profile(on_esp=False))
    ht.boot_root(grub, grub_profile(on_esp=False))
    assert bootctl(grub, "set-oneshot", "x.conf") == (1, "", "Not booted with UEFI.\n")
    ht.boot_root(root, prof)
    rc, out, err = bootctl(root, "status")
    assert rc == 0 and "Couldn't find EFI system partition." in err
    assert "      Product: systemd-boot 252.39-1~deb12u2\n" in out


def test_readonly_efivars_do_not_stick(tmp_path: Path) -> None:
    prof = kpro6(efivars_readonly=True)
    root = ht.make_root(tmp_path, prof)
    refresh(root, kernel_default=OLD)
    ht.boot_root(root, prof)
    assert bootctl(root, "set-oneshot", f"proxmox-{NEW}.conf") == (0, "", "")
    assert var(root, "LoaderEntryOneShot") is None  # the read-back shows it missing
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD


# --- panic=N ---


def test_panicking_trial_kernel_returns_to_default_with_panic_n(tmp_path: Path) -> None:
    prof = kpro6()
    root = ht.make_root(tmp_path, prof)
    with_bad_kernel(root)
    refresh(root, kernel_default=OLD, kernels=[OLD, NEW, BAD], cmdline=f"{ZFS} panic=10")
    ht.boot_root(root, prof)
    bootctl(root, "set-oneshot", f"proxmox-{BAD}.conf")
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD
    assert state(root)["boot_attempts"] == [
        {"kernel": BAD, "result": "panicked; rebooted (panic=10)"},
        {"kernel": OLD, "result": "booted"},
    ]


def test_panicking_kernel_without_panic_n_hangs(tmp_path: Path) -> None:
    prof = kpro6()
    root = ht.make_root(tmp_path, prof)
    with_bad_kernel(root)
    refresh(root, kernel_default=OLD, kernels=[OLD, NEW, BAD], cmdline=ZFS)
    ht.boot_root(root, prof)
    bootctl(root, "set-oneshot", f"proxmox-{BAD}.conf")
    with pytest.raises(boot.BrickedError, match="hangs"):
        ht.boot_root(root, prof)
    attempts = json.loads(read(root, "var/lib/gpuhost-twin/hw.json"))["boot_attempts"]
    assert attempts == [{"kernel": BAD, "result": "panicked; hung (no panic=N)"}]


# --- proxmox-boot-tool kernel pin --next-boot ---


def test_next_boot_pin_is_sticky_until_a_boot_reaches_userspace(tmp_path: Path) -> None:
    prof = kpro6()
    root = ht.make_root(tmp_path, prof)
    with_bad_kernel(root)
    pve.install(root, prof)
    (root / "etc/kernel/cmdline").write_text(f"{ZFS} panic=10\n")
    (root / "etc/kernel/proxmox-boot-manual-kernels").write_text(f"{BAD}\n")
    assert cli.run("proxmox-boot-tool", ["kernel", "pin", OLD], root)[0] == 0
    cli.run("proxmox-boot-tool", ["kernel", "pin", NEW, "--next-boot"], root)
    cli.run("proxmox-boot-tool", ["refresh"], root)
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == NEW
    assert not (root / "etc/kernel/next-boot-pin").exists()  # proxmox-boot-cleanup ran
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD
    cli.run("proxmox-boot-tool", ["kernel", "pin", BAD, "--next-boot"], root)
    cli.run("proxmox-boot-tool", ["refresh"], root)
    with pytest.raises(boot.BrickedError, match="reboot loop"):
        ht.boot_root(root, prof)  # no userspace, no cleanup: BAD again and again
    assert (root / "etc/kernel/next-boot-pin").exists()


# --- GRUB ---


def test_grub_on_esp_next_entry_is_cleared(tmp_path: Path) -> None:
    prof = grub_profile(on_esp=True)
    root = ht.make_root(tmp_path, prof)
    pve.install(root, prof)
    cli.run("proxmox-boot-tool", ["kernel", "pin", OLD], root)
    cli.run("proxmox-boot-tool", ["refresh"], root)
    cfg = json.loads(read(root, boot.BOOTCFG))
    assert (cfg["loader"], cfg["grub_on_esp"], cfg["kernel_default"]) == (
        "grub",
        ["9B1C-4F2A"],
        OLD,
    )
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD
    env = root / ESP_DIR / "9B1C-4F2A/grub/grubenv"
    devid = cfg["grub_devid"]
    grubenv.write(env, {"next_entry": f"gnulinux-advanced-{devid}>gnulinux-{NEW}-advanced-{devid}"})
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == NEW
    assert state(root)["cmdline"].startswith(f"BOOT_IMAGE=/vmlinuz-{NEW} ")
    assert grubenv.read(env) == {"next_entry": ""}  # save_env on the ESP that booted
    ht.boot_root(root, prof)
    assert state(root)["kernel"] == OLD


@pytest.mark.skipif(
    shutil.which("grub-editenv") is None,
    reason="grub-editenv not installed (Debian grub-common; ./gpuhost-setup installs it)",
)
def test_lvm_next_entry_sticks_and_a_failing_trial_kernel_loops(tmp_path: Path) -> None:
    prof = grub_profile(on_esp=False)  # boot_on_lvm: the PVE ext4/xfs layout
    root = ht.make_root(tmp_path, prof)
    with_bad_kernel(root)
    pve.install(root, prof)
    cli.run("proxmox-boot-tool", ["kernel", "pin", OLD], root)
    devid = json.loads(read(root, boot.BOOTCFG))["grub_devid"]
    env = root / "boot/grub/grubenv"
    entry = f"gnulinux-advanced-{devid}>gnulinux-{NEW}-advanced-{devid}"
    subprocess.run(["grub-editenv", str(env), "set", f"next_entry={entry}"], check=True)
    for _ in range(2):
        ht.boot_root(root, prof)
        assert state(root)["kernel"] == NEW  # not cleared: diskfilter writes fail
    listed = subprocess.run(["grub-editenv", str(env), "list"], capture_output=True, text=True)
    assert listed.stdout == f"next_entry={entry}\n"
    bad = f"gnulinux-advanced-{devid}>gnulinux-{BAD}-advanced-{devid}"
    subprocess.run(["grub-editenv", str(env), "set", f"next_entry={bad}"], check=True)
    with pytest.raises(boot.BrickedError, match="reboot loop"):
        ht.boot_root(root, prof)
    attempts = json.loads(read(root, "var/lib/gpuhost-twin/hw.json"))["boot_attempts"]
    assert {a["kernel"] for a in attempts} == {BAD}


@pytest.mark.parametrize(("grub_cfg", "loader_info"), [("", None), ("insmod bli\n", b"GRUB 2.12")])
def test_grub_on_efi_sets_loader_info_only_with_the_bli_module(
    tmp_path: Path, grub_cfg: str, loader_info: bytes | None
) -> None:
    """Debian 13's grub.cfg loads bli on EFI (/etc/grub.d/25_bli) and GRUB 2.12 then sets
    LoaderInfo; Debian 12's GRUB 2.06 sets no Boot Loader Interface variable."""
    boot_ = Boot(firmware="uefi", loader="grub", default_grub=GRUB_TEXT)
    prof = load_profile("kpro6").model_copy(update={"boot": boot_})
    root = ht.make_root(tmp_path, prof)
    pve.install(root, prof)
    cfg = root / "boot/grub/grub.cfg"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(f'if [ "$grub_platform" = "efi" ]; then\n  {grub_cfg}fi\n')
    ht.boot_root(root, prof)
    value = var(root, "LoaderInfo")
    assert (value[4:].decode("utf-16-le").rstrip("\0").encode() if value else None) == loader_info
