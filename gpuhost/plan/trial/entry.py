"""systemd-boot's trial-only entry: the trial boots the new kernel, command line and initramfs
from an entry of its own, while the entries, /etc/kernel/cmdline and initramfs the fallback boots
stay as they were until the commit (docs/reference/trial-boot.md §3). Pure: the commands are planned here and
run by deploys/trial_boot.py."""

from __future__ import annotations

from gpuhost.plan.trial.backstop import drop_backstop, write_backstop
from gpuhost.plan.trial.esp import default_is, on_esp, sh_quote, systemd_boot_entry
from gpuhost.plan.trial.params import TRIAL_MARK

# systemd-boot's trial-only entry and the directory beside it that holds its kernel and
# initramfs: proxmox-boot-tool only writes and deletes proxmox-<kver>.conf and EFI/proxmox/<kver>
# (docs/reference/trial-boot.md §3), so a refresh never touches them and the proxmox-* default never picks them.
TRIAL_ENTRY = "gpuhost-trial.conf"
TRIAL_ESP_DIR = "EFI/gpuhost-trial"
# The trial's initramfs, built by mkinitramfs beside the one update-initramfs keeps: the
# fallback's own initramfs stays as it was until the gate passed.
TRIAL_INITRD_DIR = "/boot/gpuhost-trial"


def trial_entry_text(kernel: str, options: str) -> str:
    """systemd-boot's trial-only entry (Boot Loader Specification type #1 keys)."""
    return (
        f"title    gpuhost trial of {kernel}\nversion  {kernel}\noptions  {options}\n"
        f"linux    /{TRIAL_ESP_DIR}/vmlinuz-{kernel}\n"
        f"initrd   /{TRIAL_ESP_DIR}/initrd.img-{kernel}\n"
    )


def trial_entry_steps(
    steps: dict[str, object], running: str, kernel: str, esps: tuple[str, ...], options: str
) -> dict[str, object]:
    """systemd-boot: the trial boots its own entry, with the new command line and an initramfs
    built for it, while /etc/kernel/cmdline, the proxmox-<kver>.conf entries and the fallback's
    initramfs stay as they were until the commit (docs/reference/trial-boot.md §3)."""
    new = sh_quote(kernel)
    initrd = f"{TRIAL_INITRD_DIR}/initrd.img-{kernel}"
    text = trial_entry_text(kernel, options)
    drop = f'rm -rf "$M/{TRIAL_ESP_DIR}" "$M/loader/entries/{TRIAL_ENTRY}"'
    put = (
        f'{drop} && mkdir -p "$M/{TRIAL_ESP_DIR}" && '
        f'cp /boot/vmlinuz-{new} "$M/{TRIAL_ESP_DIR}/vmlinuz-{kernel}" && '
        f'cp {sh_quote(initrd)} "$M/{TRIAL_ESP_DIR}/initrd.img-{kernel}" && '
        f'printf %s {sh_quote(text)} > "$M/loader/entries/{TRIAL_ENTRY}.new" && '
        f'mv -f "$M/loader/entries/{TRIAL_ENTRY}.new" "$M/loader/entries/{TRIAL_ENTRY}"'
    )
    tidy = [on_esp(u, drop) for u in esps] + [f"rm -rf {TRIAL_INITRD_DIR}", drop_backstop()]
    prepare = [
        *steps["prepare"],  # type: ignore[misc]
        f"rm -rf {TRIAL_INITRD_DIR} && mkdir -p {TRIAL_INITRD_DIR}",
        write_backstop(),  # into the trial's initramfs (gpuhost/plan/trial/backstop.py)
        f"mkinitramfs -o {sh_quote(initrd)} {new}",
        *(on_esp(u, put) for u in esps),
    ]
    confirm = [*steps["confirm"], f"grep -qw {sh_quote(TRIAL_MARK)} /proc/cmdline"]  # type: ignore[misc]
    # The tested configuration becomes the kernel's own: its initramfs rebuilt from the same
    # files (the target kernel's only), then pinned and synced; the trial entry goes.
    commit = [drop_backstop(), f"update-initramfs -u -k {new}"]
    if kernel == running:
        commit += ["proxmox-boot-tool refresh"]
        commit += [on_esp(u, default_is(systemd_boot_entry(kernel))) for u in esps]
    else:
        commit += list(steps["commit"])  # type: ignore[call-overload]
    return {
        **steps,
        "prepare": tuple(prepare),
        "confirm": tuple(confirm),
        "commit": (*commit, *tidy),
        "abandon": (*steps["abandon"], *tidy),  # type: ignore[misc]
    }
