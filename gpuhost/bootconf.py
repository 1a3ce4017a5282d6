"""The kernel command line in the boot loader's configuration, as the Plan's files.

gpuhost owns only the parameters it adds, and remembers which those are, so a user's own
parameters are never touched and a setting turned off removes exactly what gpuhost wrote:

- systemd-boot (proxmox-boot-tool, uefi ESPs): /etc/kernel/cmdline is one line shared with the
  user (root=, quiet, ...). gpuhost appends its parameters and lists them in
  /etc/gpuhost/kernel-cmdline, so the next run knows which ones are its own.
- GRUB: /etc/default/grub stays the user's; gpuhost's parameters live in its own drop-in
  /etc/default/grub.d/gpuhost.cfg, which update-grub sources after /etc/default/grub.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

KERNEL_CMDLINE = "/etc/kernel/cmdline"
CMDLINE_RECORD = "/etc/gpuhost/kernel-cmdline"
DEFAULT_GRUB = "/etc/default/grub"
GRUB_DROPIN = "/etc/default/grub.d/gpuhost.cfg"
RECORD_HEADER = (
    "# Managed by gpuhost: the parameters it added to /etc/kernel/cmdline, one a line.\n"
)
DROPIN_HEADER = (
    "# Managed by gpuhost; edit the inventory, not this file. update-grub sources it after\n"
    "# /etc/default/grub: it appends gpuhost's kernel parameters to every entry (recovery too).\n"
)
_DROPIN_LINE = re.compile(r"""GRUB_CMDLINE_LINUX="\$GRUB_CMDLINE_LINUX"'(?P<params>[^']*)'""")


@dataclass(frozen=True)
class BootConfig:
    """What the boot loader configuration must say, and what /proc/cmdline must show after boot."""

    files: dict[str, str | None]  # path -> content (None: absent)
    owned: list[str]  # the parameters gpuhost adds
    present: list[str]  # must be on /proc/cmdline after the next boot
    absent: list[str]  # must not be (gpuhost added them earlier; no longer wanted)
    problems: list[str]


def _record(files: dict[str, str]) -> list[str]:
    text = files.get(CMDLINE_RECORD, "")
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def user_params_systemd_boot(files: dict[str, str]) -> list[str]:
    """The user's own kernel parameters in /etc/kernel/cmdline (gpuhost's recorded ones removed)."""
    first = (files.get(KERNEL_CMDLINE) or "").split("\n", 1)[0]
    owned = set(_record(files))
    return [p for p in first.split() if p not in owned]


def systemd_boot(files: dict[str, str], wanted: list[str]) -> BootConfig:
    current = files.get(KERNEL_CMDLINE)
    if current is None or not current.strip():
        problem = (
            f"{KERNEL_CMDLINE} is missing or empty on a systemd-boot host; proxmox-boot-tool "
            "needs it with the root= parameter: create it from /proc/cmdline first"
        )
        return BootConfig({}, [], [], [], [problem])
    first, _, rest = current.partition("\n")
    params = first.split()
    recorded = _record(files)
    user = [p for p in params if p not in recorded]
    owned = [p for p in wanted if p not in user]
    # Everything after "--" is for init, not the kernel: gpuhost's parameters go before it.
    cut = user.index("--") if "--" in user else len(user)
    line = " ".join(user[:cut] + owned + user[cut:])
    record = RECORD_HEADER + "".join(f"{p}\n" for p in owned) if owned else None
    return BootConfig(
        files={KERNEL_CMDLINE: f"{line}\n{rest}", CMDLINE_RECORD: record},
        owned=owned,
        present=list(wanted),
        absent=[p for p in recorded if p not in wanted and p not in user],
        problems=[],
    )


def render_dropin(params: list[str]) -> str:
    """The drop-in: parameters appended to GRUB_CMDLINE_LINUX, single-quoted for sh.

    The parameters passed the spec's kernel-parameter grammar already; quoting them again with
    sh's own rules keeps the file safe to source whatever they hold.
    """
    return (
        DROPIN_HEADER
        + f'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX"{shlex.quote(" " + " ".join(params))}\n'
    )


def dropin_params(text: str | None) -> list[str]:
    """gpuhost's parameters in its drop-in, as written by :func:`render_dropin`."""
    for line in (text or "").splitlines():
        if match := _DROPIN_LINE.fullmatch(line.strip()):
            return match["params"].split()
    return []


def grub(files: dict[str, str], user: list[str], wanted: list[str]) -> BootConfig:
    """``user``: the parameters the user's own GRUB files configure."""
    previous = dropin_params(files.get(GRUB_DROPIN))
    owned = [p for p in wanted if p not in user]
    return BootConfig(
        files={GRUB_DROPIN: render_dropin(owned) if owned else None},
        owned=owned,
        present=list(wanted),
        absent=[p for p in previous if p not in wanted and p not in user],
        problems=[],
    )


_GRUB_VAR = re.compile(r"^\s*(?:export\s+)?(?P<var>GRUB_CMDLINE_LINUX(?:_DEFAULT)?)=(?P<value>.*)$")


def grub_user_params(files: dict[str, str]) -> list[str]:
    """The kernel parameters the user's GRUB files configure (gpuhost's own drop-in excluded)."""
    values = {"GRUB_CMDLINE_LINUX": "", "GRUB_CMDLINE_LINUX_DEFAULT": ""}
    paths = [
        DEFAULT_GRUB,
        *sorted(p for p in files if p.startswith("/etc/default/grub.d/") and p != GRUB_DROPIN),
    ]
    for path in paths:
        for line in (files.get(path) or "").splitlines():
            if match := _GRUB_VAR.match(line):
                words = shlex.split(match["value"], comments=True)
                values[match["var"]] = " ".join(words)
    return values["GRUB_CMDLINE_LINUX"].split() + values["GRUB_CMDLINE_LINUX_DEFAULT"].split()
