"""The kernel command line in the boot loader's configuration, as the Plan's files.

gpuhost owns only the parameters it adds, and remembers which those are, so a user's own
parameters are never touched and a setting turned off removes exactly what gpuhost wrote:

- systemd-boot (proxmox-boot-tool, uefi ESPs): /etc/kernel/cmdline is one line shared with the
  user (root=, quiet, ...). gpuhost appends its parameters and lists them in
  /etc/gpuhost/kernel-cmdline, so the next run knows which ones are its own.
- GRUB: /etc/default/grub stays the user's; gpuhost's parameters live in its own drop-in
  /etc/default/grub.d/zz-gpuhost.cfg, which update-grub sources after /etc/default/grub and
  after Proxmox's own drop-ins (see gpuhost/plan/boot/grub.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.paths import CONFIG_DIR
from gpuhost.plan.boot import grub as grubconf

KERNEL_CMDLINE = "/etc/kernel/cmdline"
CMDLINE_RECORD = f"{CONFIG_DIR}/kernel-cmdline"
DEFAULT_GRUB = "/etc/default/grub"
GRUB_DROPIN = grubconf.DROPIN
RECORD_HEADER = (
    "# Managed by gpuhost: the parameters it added to /etc/kernel/cmdline, one a line.\n"
)


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
    # Everything after "--" is for init, not the kernel: gpuhost's parameters go before it.
    cut = user.index("--") if "--" in user else len(user)
    owned = [p for p in wanted if p not in user[:cut]]
    line = " ".join(user[:cut] + owned + user[cut:])
    record = RECORD_HEADER + "".join(f"{p}\n" for p in owned) if owned else None
    return BootConfig(
        files={KERNEL_CMDLINE: f"{line}\n{rest}", CMDLINE_RECORD: record},
        owned=owned,
        present=list(wanted),
        absent=[p for p in recorded if p not in wanted and p not in user[:cut]],
        problems=[],
    )


def configured(loader: str, files: dict[str, str]) -> tuple[list[tuple[str, str]], list[str]]:
    """The user's own parameters for the next boot, with where each is set, and problems.

    gpuhost's own parameters are left out: it may change or remove those.
    """
    if loader == "systemd-boot":
        params = user_params_systemd_boot(files)
        kernel = params[: params.index("--")] if "--" in params else params  # the rest is init's
        return [(p, KERNEL_CMDLINE) for p in kernel], []
    theirs = {path: text for path, text in files.items() if path != GRUB_DROPIN}
    try:
        parsed = grubconf.parse_grub_defaults(theirs)
    except grubconf.GrubConfigError as exc:
        return [], [str(exc)]
    return [(p.value, p.origin) for p in parsed.normal], []


def _dropin_params(text: str | None) -> list[str]:
    if not text:
        return []
    return grubconf.parse_grub_defaults({GRUB_DROPIN: text}).from_dropin()


def grub(files: dict[str, str], user: list[str], wanted: list[str]) -> BootConfig:
    """``user``: the parameters the user's own GRUB files configure."""
    previous = _dropin_params(files.get(GRUB_DROPIN))
    owned = [p for p in wanted if p not in user]
    return BootConfig(
        files={GRUB_DROPIN: grubconf.render_dropin(owned) if owned else None},
        owned=owned,
        present=list(wanted),
        absent=[p for p in previous if p not in wanted and p not in user],
        problems=[],
    )
