"""Plain GRUB's trial-only menu entry: the trial boots the kernel with the new command line and
an initramfs built for it from an entry of gpuhost's own, while /etc/default/grub(.d), the
kernel's own entries and its initramfs stay as they were until the commit. Pure: the commands
are planned here and run by deploys/trial_boot.py.

How GRUB gets the entry, from grub-common 2.06 (Debian 12):
- grub-mkconfig (update-grub) runs every executable, non-garbage file of /etc/grub.d in name
  order and splices its output into grub.cfg (util/grub-mkconfig.in, the `for i in
  "${grub_mkconfig_dir}"/*` loop); a script that fails fails update-grub (`set -e`).
- 45_ sorts after 10_linux (and 40_/41_custom), so menu entry 0, the default of GRUB_DEFAULT=0,
  stays 10_linux's; the pinned default is an id path anyway (trial-boot.md §2.5).
- A menu entry's id is what follows `$menuentry_id_option` (util/grub.d/10_linux.in, its
  `echo "menuentry ... \\$menuentry_id_option 'gnulinux-...'"` lines; 00_header sets the
  variable to --id). next_entry may name a top-level entry by id (docs/grub.texi, "default":
  a menu item is a number, a title or an id), and 00_header makes it the default once
  (trial-boot.md §2.1): `grub-reboot gpuhost-trial`, i.e. next_entry=gpuhost-trial.
- Paths are /boot/...: GRUB's root is the device it read /boot/grub/grub.cfg from, and PVE's
  ext4/xfs installs keep /boot on the root file system (trial-boot.md §0, [INST] fstab lines).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from facts.boot import GRUB_CFG
from gpuhost import grubconf
from gpuhost.trialentry import TRIAL_INITRD_DIR
from gpuhost.trialesp import grub_default_is, grub_entry, sh_quote
from gpuhost.trialparams import TRIAL_MARK

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


def grub_trial_script(kernel: str, options: str) -> str:
    """/etc/grub.d/45_gpuhost-trial: one top-level entry while the kernel image and the trial's
    initramfs exist, nothing otherwise (a leftover script never adds a broken entry)."""
    image = f"/boot/vmlinuz-{kernel}"
    initrd = f"{TRIAL_INITRD_DIR}/initrd.img-{kernel}"
    return (
        "#!/bin/sh\n"
        "# gpuhost's trial-only boot entry: next_entry (grub-reboot) names it for one boot; the\n"
        "# trial's commit, or its abandon after a failure, removes this file and runs update-grub.\n"
        "set -e\n"
        f"[ -f {image} ] && [ -f {initrd} ] || exit 0\n"
        f'echo "Found gpuhost trial entry: {image}" >&2\n'
        "cat <<'EOF'\n"
        f"menuentry 'gpuhost trial of Linux {kernel}' --class gnu-linux --class gnu --class os "
        f"$menuentry_id_option '{GRUB_TRIAL_ID}' {{\n"
        "\tinsmod gzio\n"
        f"\techo\t'Loading Linux {kernel} (gpuhost trial) ...'\n"
        f"\tlinux\t{image} {options}\n"
        "\techo\t'Loading initial ramdisk ...'\n"
        f"\tinitrd\t{initrd}\n"
        "}\n"
        "EOF\n"
    )


def grub_trial_steps(
    steps: dict[str, object], running: str, kernel: str, devid: str, options: str
) -> dict[str, object]:
    """Plain GRUB: the trial boots gpuhost-trial (next_entry), the fallback is the pinned
    kernel's own entry, untouched; the commit writes the new configuration into the kernel's
    own entry and initramfs (the target kernel's only) and removes the trial entry."""
    new = sh_quote(kernel)
    initrd = f"{TRIAL_INITRD_DIR}/initrd.img-{kernel}"
    script = sh_quote(GRUB_TRIAL_SCRIPT)
    quoted_id = f"'{GRUB_TRIAL_ID}'"  # as the menuentry line carries it
    has_entry = f"grep -qF {sh_quote(quoted_id)} {GRUB_CFG}"
    tidy = [f"rm -f {script} {script}.new", f"rm -rf {TRIAL_INITRD_DIR}", "update-grub"]
    prepare = [
        *steps["prepare"],  # type: ignore[misc]
        f"rm -rf {TRIAL_INITRD_DIR} && mkdir -p {TRIAL_INITRD_DIR}",
        f"mkinitramfs -o {sh_quote(initrd)} {new}",
        f"printf %s {sh_quote(grub_trial_script(kernel, options))} > {script}.new && "
        f"chmod 755 {script}.new && mv -f {script}.new {script}",
        "update-grub",
        has_entry,
        grub_default_is(grub_entry(running, devid), GRUB_CFG),  # the fallback stays the default
    ]
    confirm = [*steps["confirm"], f"grep -qw {sh_quote(TRIAL_MARK)} /proc/cmdline"]  # type: ignore[misc]
    commit = [
        f"update-initramfs -u -k {new}",
        *tidy,
        *steps["commit"],  # type: ignore[misc]
        f"! {has_entry}",
    ]
    return {
        **steps,
        "prepare": tuple(prepare),
        "confirm": tuple(confirm),
        "commit": tuple(commit),
        "abandon": (*steps["abandon"], *tidy),  # type: ignore[misc]
    }
