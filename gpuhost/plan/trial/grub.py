"""GRUB's trial-only menu entry: the trial boots the kernel with the new command line and an
initramfs built for it from an entry of gpuhost's own, while /etc/default/grub(.d), the
kernel's own entries and its initramfs stay as they were until the commit. Pure: the commands
are planned here and run by deploys/trial_boot.py.

How GRUB gets the entry, from grub-common 2.06 (Debian 12):
- grub-mkconfig (update-grub) runs every executable, non-garbage file of /etc/grub.d in name
  order and splices its output into grub.cfg (util/grub-mkconfig.in, the `for i in
  "${grub_mkconfig_dir}"/*` loop); a script that fails fails update-grub (`set -e`).
- 45_ sorts after 10_linux (and 40_/41_custom), so menu entry 0, the default of GRUB_DEFAULT=0,
  stays 10_linux's; the pinned default is an id path anyway (docs/reference/trial-boot.md §2.5).
- A menu entry's id is what follows `$menuentry_id_option` (util/grub.d/10_linux.in, its
  `echo "menuentry ... \\$menuentry_id_option 'gnulinux-...'"` lines; 00_header sets the
  variable to --id). next_entry may name a top-level entry by id (docs/grub.texi, "default":
  a menu item is a number, a title or an id), and 00_header makes it the default once
  (docs/reference/trial-boot.md §2.1): `grub-reboot gpuhost-trial`, i.e. next_entry=gpuhost-trial.
- Paths are made as 10_linux makes them (make_system_path_relative_to_its_root of
  grub-mkconfig_lib, 10_linux.in's rel_dirname): /boot/... where /boot is on the root file
  system (PVE's ext4/xfs installs), /... on an ESP that the refresh bind-mounts on /boot.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpuhost.observe.boot import GRUB_CFG
from gpuhost.plan.boot import grub as grubconf
from gpuhost.plan.trial.backstop import drop_backstop, write_backstop
from gpuhost.plan.trial.entry import TRIAL_INITRD_DIR
from gpuhost.plan.trial.esp import grub_default_is, grub_entry, on_esp, sh_quote
from gpuhost.plan.trial.params import TRIAL_MARK

GRUB_TRIAL_ID = "gpuhost-trial"
GRUB_TRIAL_SCRIPT = "/etc/grub.d/45_gpuhost-trial"
# What a kernel parameter may hold to go verbatim into grub.cfg's `linux` line: GRUB's script
# parser would read quotes, $, ;, braces and the like itself.
_PARAM = re.compile(r"[A-Za-z0-9_.,:/=+@%-]+")


def unsafe_options(options: str) -> list[str]:
    """Parameters that cannot go into the trial entry as they are."""
    return [p for p in options.split() if not _PARAM.fullmatch(p)]


def grub_trial_options(running: list[str], files: Mapping[str, str | None]) -> str:
    """The options the kernel's own entry gets once the planned files are in place, as
    10_linux renders them (`root=<device> ro ${GRUB_CMDLINE_LINUX} ${GRUB_CMDLINE_LINUX_DEFAULT}`;
    the root device as the running kernel got it): the trial boots exactly what the commit makes
    the default. Empty when the files cannot be evaluated (the plan names why)."""
    try:
        parsed = grubconf.parse_grub_defaults({p: c for p, c in files.items() if c is not None})
    except grubconf.GrubConfigError:
        return ""
    root = [p for p in running if p.startswith("root=")][:1]
    return " ".join([*root, "ro", *(p.value for p in parsed.normal)])


# A trial entry whose kernel or initramfs GRUB cannot load (a file gone, or refused by shim
# under Secure Boot: "bad shim signature") would stop at "Press any key to continue..." for
# someone at the console. 00_header cleared next_entry before the menu (save_env), so a reboot
# from the entry boots the default: the pinned, known-good kernel. GRUB's own `fallback` cannot
# name that entry: it takes a top-level entry number (grub-core/normal/menu.c), and the pinned
# kernel's entry sits in the "Advanced options" submenu.
BACK_TO_DEFAULT = "gpuhost: the trial entry did not load; rebooting into the default entry"


def _or_back(command: str, back: bool) -> str:
    if not back:  # next_entry stays set where GRUB cannot clear it: a reboot would loop
        return f"\t{command}\n"
    return (
        f"\tif {command}; then true; else\n\t\techo '{BACK_TO_DEFAULT}'\n"
        "\t\tsleep 3\n\t\treboot\n\tfi\n"
    )


def grub_trial_script(kernel: str, options: str, back_on_failure: bool = True) -> str:
    """/etc/grub.d/45_gpuhost-trial: one top-level entry while the kernel image and the trial's
    initramfs exist under /boot, nothing otherwise (a leftover script never adds a broken
    entry). Paths as 10_linux makes them (make_system_path_relative_to_its_root): /boot/... on
    a root file system, /... on an ESP that proxmox-boot-tool's refresh bind-mounts on /boot.
    ``options`` holds no shell or GRUB syntax (unsafe_options), so the heredoc may expand.
    ``back_on_failure``: an entry that cannot load its files reboots (BACK_TO_DEFAULT); off
    where GRUB cannot clear next_entry (grub-no-oneshot)."""
    image = f"/boot/vmlinuz-{kernel}"
    initrd = f"{TRIAL_INITRD_DIR}/initrd.img-{kernel}"
    return (
        "#!/bin/sh\n"
        "# gpuhost's trial-only boot entry: next_entry (grub-reboot) names it for one boot; the\n"
        "# trial's commit, or its abandon after a failure, removes this file and the entry.\n"
        "set -e\n"
        f"[ -f {image} ] && [ -f {initrd} ] || exit 0\n"
        '. "${pkgdatadir:-/usr/share/grub}/grub-mkconfig_lib"\n'
        f"linux=$(make_system_path_relative_to_its_root {image})\n"
        f"initrd=$(make_system_path_relative_to_its_root {initrd})\n"
        'echo "Found gpuhost trial entry: $linux" >&2\n'
        "cat <<EOF\n"
        f"menuentry 'gpuhost trial of Linux {kernel}' --class gnu-linux --class gnu --class os "
        f"\\$menuentry_id_option '{GRUB_TRIAL_ID}' {{\n"
        "\tinsmod gzio\n"
        f"\techo\t'Loading Linux {kernel} (gpuhost trial) ...'\n"
        + _or_back(f"linux\t$linux {options}", back_on_failure)
        + "\techo\t'Loading initial ramdisk ...'\n"
        + _or_back("initrd\t$initrd", back_on_failure)
        + "}\n"
        "EOF\n"
    )


def grub_trial_steps(
    steps: dict[str, object],
    running: str,
    kernel: str,
    devid: str,
    options: str,
    esps: tuple[str, ...] = (),
    back_on_failure: bool = True,
) -> dict[str, object]:
    """GRUB: the trial boots gpuhost-trial (next_entry), the fallback is the pinned kernel's own
    entry, untouched; the commit writes the new configuration into the kernel's own entry and
    initramfs (the target kernel's only) and removes the trial entry. ``esps``: GRUB on
    proxmox-boot-tool's ESPs, whose refresh renders each ESP's grub.cfg with the ESP on /boot
    ([PKH] zz-proxmox-boot: `mount --bind <ESP> /boot; update-grub`), so the trial's initramfs
    goes to <ESP>/gpuhost-trial/, which the refresh leaves alone (it removes only top-level
    vmlinuz-*/initrd.img-* of kernels it does not keep)."""
    new = sh_quote(kernel)
    initrd = f"{TRIAL_INITRD_DIR}/initrd.img-{kernel}"
    script = sh_quote(GRUB_TRIAL_SCRIPT)
    quoted_id = f"'{GRUB_TRIAL_ID}'"  # as the menuentry line carries it
    cfgs = ['"$M/grub/grub.cfg"'] if esps else [GRUB_CFG]

    def every(body: str) -> list[str]:  # each grub.cfg that boots
        if not esps:
            return [body.replace("{cfg}", GRUB_CFG)]
        return [on_esp(u, body.replace("{cfg}", cfgs[0])) for u in esps]

    has_entry = f"grep -qF {sh_quote(quoted_id)} {{cfg}}"
    on_esps = "gpuhost-trial"  # the ESP is GRUB's /boot: the same path below it
    drop = f'rm -rf "$M/{on_esps}"'
    put = f'{drop} && mkdir -p "$M/{on_esps}" && cp {sh_quote(initrd)} "$M/{on_esps}/"'
    render = "proxmox-boot-tool refresh" if esps else "update-grub"
    tidy = [f"rm -f {script} {script}.new", *(on_esp(u, drop) for u in esps)]
    tidy += [f"rm -rf {TRIAL_INITRD_DIR}", drop_backstop(), render]
    # One render each for prepare and commit: the loader's own steps render too (update-grub,
    # proxmox-boot-tool refresh, or `kernel pin`, which runs update-grub on plain GRUB: §2.5), and
    # under each render grub-mkconfig runs every /etc/grub.d script again (seconds on a server).
    inner = list(steps["prepare"])  # type: ignore[call-overload]
    cut = inner.index(render)  # the kernel's own entry checked after the one render below
    prepare = [
        *inner[:cut],
        f"rm -rf {TRIAL_INITRD_DIR} && mkdir -p {TRIAL_INITRD_DIR}",
        write_backstop(),  # into the trial's initramfs (gpuhost/plan/trial/backstop.py)
        f"mkinitramfs -o {sh_quote(initrd)} {new}",
        *(on_esp(u, put) for u in esps),
        f"printf %s {sh_quote(grub_trial_script(kernel, options, back_on_failure))} > {script}.new && "
        f"chmod 755 {script}.new && mv -f {script}.new {script}",
        render,
        # the entry in each grub.cfg that boots, and the fallback still its default
        *every(f"{has_entry} && {grub_default_is(grub_entry(running, devid), '{cfg}')}"),
        *inner[cut + 1 :],
    ]
    confirm = [*steps["confirm"], f"grep -qw {sh_quote(TRIAL_MARK)} /proc/cmdline"]  # type: ignore[misc]
    if esps and kernel == running:  # no pin to move: next_entry cleared, the entry gone
        core = [c for c in steps["commit"] if "unset next_entry" in c]  # type: ignore[attr-defined]
    else:
        core = list(steps["commit"])  # type: ignore[call-overload]
    pin_renders = not esps and any(c.startswith("proxmox-boot-tool kernel pin") for c in core)
    if pin_renders or "proxmox-boot-tool refresh" in core:  # the entry gone from that render
        tidy_commit = [c for c in tidy if c != render]
    else:
        tidy_commit = tidy
    commit = [
        drop_backstop(),
        f"update-initramfs -u -k {new}",
        *tidy_commit,
        *core,
        *every(f"! {has_entry} && {grub_default_is(grub_entry(kernel, devid), '{cfg}')}"),
    ]
    return {
        **steps,
        "prepare": tuple(prepare),
        "confirm": tuple(confirm),
        "commit": tuple(commit),
        "abandon": (*steps["abandon"], *tidy),  # type: ignore[misc]
    }
