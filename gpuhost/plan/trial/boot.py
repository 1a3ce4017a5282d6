"""Brick-safe trial boot of a new kernel: planned from the host's boot path, pure.

With no pin, Proxmox boots the newest installed kernel, so the running kernel is pinned before
the new one is installed; the new kernel then boots exactly once through the boot loader's own
one-shot (systemd-boot's LoaderEntryOneShot, GRUB's next_entry where GRUB can clear it) into
a trial-only entry of gpuhost's (trialentry.py, trialgrub.py), and
only after the post-boot checks pass is it pinned as the default. A trial that fails in any way
reboots into the pinned kernel. Never ``proxmox-boot-tool kernel pin --next-boot``: a userspace
unit clears that pin, so a kernel that dies before it would boot again and again.

Mechanics and sources: docs/reference/trial-boot.md (section numbers below refer to it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuhost.observe.boot import BOOT_UUIDS, GRUB_CFG, GRUBENV, NEXT_BOOT_PIN, BootPathInfo
from gpuhost.observe.proxmox import BootToolStatus
from gpuhost.plan.trial.entry import TRIAL_ENTRY, trial_entry_steps
from gpuhost.plan.trial.esp import (
    default_is,
    efivar,
    efivar_is,
    free_at_least,
    grub_default_is,
    grub_entry,
    grub_has,
    next_entry_is,
    no_next_entry,
    on_esp,
    sh_quote,
    systemd_boot_entry,
)
from gpuhost.plan.trial.grub import GRUB_TRIAL_ID, grub_trial_steps, unsafe_options
from gpuhost.plan.trial.params import trial_cmdline
from gpuhost.spec.grammar import KERNEL_RE

METHODS = ("systemd-boot", "grub-esp", "grub", "grub-no-oneshot", "unsupported", "unknown")
APPLICABLE = ("systemd-boot", "grub-esp", "grub", "grub-no-oneshot")
# Boot paths where gpuhost tries every boot through a trial-only entry of its own (systemd-boot's
# gpuhost-trial.conf, GRUB's gpuhost-trial menu entry).
ENTRY_METHODS = ("systemd-boot", "grub-esp", "grub", "grub-no-oneshot")

MIB = 1024 * 1024
# Room for one more kernel: a PVE vmlinuz is ~15 MiB, its initramfs (with nvidia) up to ~120 MiB.
MIN_BOOT_FREE = 300 * MIB
MIN_ESP_FREE = 200 * MIB
_ID_PART = re.compile(r"[0-9A-Za-z-]+")  # ESP UUIDs and GRUB devids (fs UUID, ZFS pool GUID)

WAYS_OUT = (
    "move the host to GRUB on an ESP managed by proxmox-boot-tool (proxmox-boot-tool init "
    "<ESP partition> grub; the ESP must not be mounted at /boot/efi), or set "
    "kernel.trial.without_oneshot: true to accept that a trial boot (a new kernel, command line "
    "or initramfs) that panics or hangs before userspace keeps booting until someone at the "
    "console or IPMI picks the old entry"
)


@dataclass(frozen=True)
class TrialBoot:
    """One planned trial boot of ``kernel`` from ``running``; each step is a list of commands
    that must all succeed, in order, before the next step starts."""

    method: str  # one of METHODS
    running: str
    kernel: str
    entry: str | None  # the exact one-shot id
    refusal: str | None  # why the trial must not run, and the ways out
    checks: tuple[str, ...] = ()  # room on /boot and every ESP, before anything is installed
    pin_running: tuple[str, ...] = ()  # before the new kernel is installed: nothing else boots
    prepare: tuple[str, ...] = ()  # after it is installed: synced, its entry on every ESP
    oneshot: tuple[str, ...] = ()  # set the one-shot, read it back
    confirm: tuple[str, ...] = ()  # after the trial boot and the audit's host checks
    commit: tuple[str, ...] = ()  # make the new kernel the default
    abandon: tuple[str, ...] = ()  # back on the old kernel after a failed trial: tidy up
    # The userspace deadline is gpuhost-trial-deadline.timer (installed by the Plan's files,
    # driven by the trial record, gpuhost/plan/trial/state.py): seconds after boot for the record,
    # and what its reboot must run first where GRUB cannot clear next_entry itself.
    deadline_s: int = 0
    before_deadline_reboot: tuple[str, ...] = ()
    cmdline: tuple[str, ...] = ()  # on the command line for the trial boot
    notes: tuple[str, ...] = ()
    # The trial-only entry's options (the planned command line and ``cmdline``); None where the
    # trial boots one of the loader's own entries (a kernel booted by other means, gated only).
    entry_options: str | None = None

    @property
    def same_kernel(self) -> bool:
        """A trial of a new command line or initramfs on the running kernel."""
        return self.kernel == self.running

    @property
    def what(self) -> str:
        if self.same_kernel:
            return f"the new boot configuration of kernel {self.kernel}"
        return f"kernel {self.kernel}"

    @property
    def can_apply(self) -> bool:
        return self.refusal is None and self.method in APPLICABLE

    @property
    def summary(self) -> str:
        what = (
            f"the new command line/initramfs on {self.kernel}" if self.same_kernel else self.kernel
        )
        if not self.can_apply:
            return f"trial boot of {what} refused ({self.method}): {self.refusal}"
        return (
            f"trial boot of {what} via {self.method} one-shot {self.entry!r}, "
            f"{self.running} pinned until the checks pass"
        )


def classify(path: BootPathInfo, tool: BootToolStatus | None) -> str:
    """Which one-shot this host has (§0)."""
    if not path.known:
        return "unknown"
    if path.esp_uuids or (tool is not None and tool.configured):
        if tool is None:
            return "unknown"  # ESPs listed but proxmox-boot-tool's status was not read
        modes = {mode for _, mode, _ in tool.esps}
        if modes == {"uefi"}:
            return "systemd-boot"
        if modes == {"grub"}:
            return "grub-esp"
        return "unsupported"  # no ESP set up, or ESPs with different loaders
    if path.grub_source or path.grub_fstype:
        return "grub-no-oneshot" if path.grubenv_unwritable_by_grub else "grub"
    return "unsupported"


def trial_entry_method(path: BootPathInfo, tool: BootToolStatus | None) -> str | None:
    """How this host boots a trial through a trial-only entry (None: it has none), so a new
    command line or initramfs on the running kernel can be tried with the old one as fallback."""
    method = classify(path, tool)
    return method if method in ENTRY_METHODS else None


def plan_trial_boot(
    running: str,
    kernel: str,
    path: BootPathInfo,
    tool: BootToolStatus | None,
    panic_timeout: int = 10,
    deadline_minutes: int = 20,
    without_oneshot: bool = False,
    options: str = "",
    own_entry: bool = True,
) -> TrialBoot:
    """The trial boot of ``kernel`` on a host running ``running``, or why it is refused.

    ``options``: the planned command line (systemd-boot's /etc/kernel/cmdline first line; on
    GRUB what 10_linux renders from the planned /etc/default/grub(.d)), which the trial entry
    boots with while the loader files keep the fallback's until the commit.
    ``own_entry`` False: the kernel was booted by other means and is only gated and pinned."""
    method = classify(path, tool)
    use_entry = method in ENTRY_METHODS and own_entry
    problems: list[str] = []
    for what, value in (("running kernel", running), ("new kernel", kernel)):
        if not KERNEL_RE.fullmatch(value):
            problems.append(f"the {what} {value!r} is not a Proxmox kernel release")
    if method == "unknown":
        problems.append(
            "the boot path is not known (a snapshot taken before gpuhost read BootPath, or "
            "proxmox-boot-tool status missing); capture the facts again"
        )
    elif method == "unsupported":
        problems.append(
            "no supported one-shot: neither systemd-boot nor GRUB on proxmox-boot-tool ESPs "
            "(all ESPs with one loader), nor GRUB under /boot/grub"
        )
    elif tool is None:
        problems.append("proxmox-boot-tool is not installed; gpuhost pins kernels with it")
    if path.boot_free is not None and path.boot_free < MIN_BOOT_FREE:
        problems.append(
            f"/boot has {path.boot_free // MIB} MiB free, a new kernel needs {MIN_BOOT_FREE // MIB}"
            " MiB; remove kernels that are neither running nor kept"
        )
    esps = tuple(path.esp_uuids or ())
    if any(not _ID_PART.fullmatch(u) for u in esps):
        problems.append(f"{BOOT_UUIDS} holds an entry that is not a partition UUID: {esps}")
    devid = path.grub_devid
    entry: str | None = None
    if method == "systemd-boot":
        entry = TRIAL_ENTRY if use_entry else systemd_boot_entry(kernel)
        if use_entry and not options.strip():
            problems.append("the planned kernel command line for the trial entry is empty")
        if not path.uefi or not path.systemd_boot_started:
            problems.append(
                "the ESPs are set up for systemd-boot but this boot did not start through it "
                f"(LoaderInfo: {path.efivars.get('LoaderInfo', 'none')!r}), so bootctl cannot set "
                "a one-shot; boot the host through systemd-boot first"
            )
        if path.bootctl is False:
            problems.append(
                "bootctl, which sets systemd-boot's one-shot, is not installed: apt install "
                "systemd-boot-tools (Proxmox VE 9; on Proxmox VE 8 it comes with systemd-boot)"
            )
    elif method in ("grub", "grub-esp", "grub-no-oneshot"):
        if devid is None or not _ID_PART.fullmatch(devid):
            problems.append(
                f"{GRUB_CFG} has no 'gnulinux-advanced-<id>' submenu id to build the GRUB entry "
                "id from; run update-grub"
            )
            devid = None
        else:
            entry = GRUB_TRIAL_ID if use_entry else grub_entry(kernel, devid)
        if use_entry and not options.strip():
            problems.append("the planned kernel command line for the trial entry is empty")
        if use_entry and unsafe_options(options):
            problems.append(
                f"the command line holds {' '.join(unsafe_options(options))}, which cannot go "
                "into GRUB's trial entry as it is; remove it from the running command line"
            )
    if running == kernel and not use_entry:
        problems.append(
            "a new command line or initramfs is tried through a trial-only boot entry, which "
            "gpuhost makes on systemd-boot and GRUB hosts only"
        )
    if method == "grub-no-oneshot" and not without_oneshot:
        reason = path.grubenv_unwritable_by_grub
        what = "the trial entry" if running == kernel else "a trial kernel"
        problems.append(
            f"no true one-shot on this host: {reason}, so GRUB cannot clear next_entry and "
            f"{what} would stay the default (a panicking one would boot forever). Ways out: "
            f"{WAYS_OUT}"
        )
    notes: list[str] = []
    if path.next_boot_pin:
        notes.append(
            f"a stale {NEXT_BOOT_PIN} ({path.next_boot_pin}) is removed first: it would win "
            "over the pin on every refresh"
        )
    if method == "grub-no-oneshot" and without_oneshot:
        notes.append(
            "no one-shot (kernel.trial.without_oneshot): next_entry sticks until the deadline "
            "or the commit clears it; recovery from a trial boot that dies early needs the console"
        )
    refusal = "; ".join(problems) if problems else None
    cmdline = trial_cmdline(panic_timeout, deadline_minutes * 60)
    base = TrialBoot(
        method=method,
        running=running,
        kernel=kernel,
        entry=entry,
        refusal=refusal,
        cmdline=cmdline,
        notes=tuple(notes),
        entry_options=" ".join([*options.split(), *cmdline]) if use_entry else None,
    )
    if refusal is not None or entry is None:
        return base
    steps = _steps(method, running, kernel, entry, devid, esps, deadline_minutes)
    if base.entry_options is not None and method == "systemd-boot":
        steps = trial_entry_steps(steps, running, kernel, esps, base.entry_options)
    elif base.entry_options is not None:
        assert devid is not None
        on_esps = esps if method == "grub-esp" else ()
        steps = grub_trial_steps(
            steps,
            running,
            kernel,
            devid,
            base.entry_options,
            on_esps,
            back_on_failure=method != "grub-no-oneshot",
        )
    return TrialBoot(**{**base.__dict__, **steps})


def _steps(
    method: str,
    running: str,
    kernel: str,
    entry: str,
    devid: str | None,
    esps: tuple[str, ...],
    deadline_minutes: int,
) -> dict[str, object]:
    old, new = sh_quote(running), sh_quote(kernel)
    on_esps = esps if method in ("systemd-boot", "grub-esp") else ()

    def every_esp(body: str) -> list[str]:
        return [on_esp(u, body) for u in on_esps]

    checks = [free_at_least("/boot", MIN_BOOT_FREE)]
    checks += every_esp(free_at_least('"$M"', MIN_ESP_FREE))
    pin = [f"rm -f {NEXT_BOOT_PIN}", f"proxmox-boot-tool kernel pin {old}"]
    prepare = [f"test -e /boot/vmlinuz-{new}"]
    # GRUB cannot clear next_entry there: without this the deadline's reboot would start the
    # trial kernel again, every time.
    before_reboot = (
        [f"grub-editenv {GRUBENV} unset next_entry"] if method == "grub-no-oneshot" else []
    )
    oneshot = [
        # a loaded kexec kernel would bypass the boot loader: the one-shot would be neither
        # used nor consumed (pitfall 15)
        'test "$(cat /sys/kernel/kexec_loaded 2>/dev/null || echo 0)" = 0',
    ]
    # the trial record (and with it the deadline) is the deploy's to write and remove
    confirm = [f'test "$(uname -r)" = {new}']
    commit: list[str] = []
    abandon: list[str] = []
    if method == "systemd-boot":
        pin += ["proxmox-boot-tool refresh"]
        pin += every_esp(default_is(systemd_boot_entry(running)))
        kentry = systemd_boot_entry(kernel)  # the kernel's own entry, its default after the commit
        if kernel != running:
            prepare += [f"proxmox-boot-tool kernel add {new}", "proxmox-boot-tool refresh"]
        prepare += every_esp(
            f'test -f "$M/loader/entries/{kentry}" && '
            f'test -f "$M/EFI/proxmox/{kernel}/vmlinuz-{kernel}" && '
            + default_is(systemd_boot_entry(running))
        )
        oneshot += [
            'bootctl set-default ""',  # a LoaderEntryDefault override beats loader.conf
            f"test ! -e {efivar('LoaderEntryDefault')}",
            f"bootctl set-oneshot {sh_quote(entry)}",
            efivar_is("LoaderEntryOneShot", entry),  # firmware may refuse the write (§1.7)
        ]
        confirm += [
            efivar_is("LoaderEntrySelected", entry),
            f"test ! -e {efivar('LoaderEntryOneShot')}",
        ]
        commit += [f"proxmox-boot-tool kernel pin {new}"]
        commit += [f"proxmox-boot-tool kernel add {old}", f"proxmox-boot-tool kernel remove {new}"]
        commit += ["proxmox-boot-tool refresh"]
        commit += every_esp(default_is(kentry))
        abandon += ['bootctl set-oneshot ""']
    elif method == "grub-esp":
        assert devid is not None
        cfg = '"$M/grub/grub.cfg"'
        env = '"$M/grub/grubenv"'
        pin += ["proxmox-boot-tool refresh"]
        pin += every_esp(grub_default_is(grub_entry(running, devid), cfg))
        prepare += [f"proxmox-boot-tool kernel add {new}", "proxmox-boot-tool refresh"]
        prepare += every_esp(grub_has(kernel, devid, cfg))
        # next_entry on every ESP: whichever the firmware starts consumes its own (§2.4)
        oneshot += every_esp(
            f"grub-editenv {env} set {sh_quote(f'next_entry={entry}')} && {next_entry_is(entry, env)}"
        )
        commit += every_esp(f"grub-editenv {env} unset next_entry && {no_next_entry(env)}")
        commit += [f"proxmox-boot-tool kernel pin {new}"]
        commit += [f"proxmox-boot-tool kernel add {old}", f"proxmox-boot-tool kernel remove {new}"]
        commit += ["proxmox-boot-tool refresh"]
        commit += every_esp(grub_default_is(grub_entry(kernel, devid), cfg))
        abandon += every_esp(f"grub-editenv {env} unset next_entry")
    else:  # plain GRUB: `kernel pin` runs update-grub itself (§2.5)
        assert devid is not None
        pin += [grub_default_is(grub_entry(running, devid), GRUB_CFG)]
        prepare += ["update-grub", grub_has(kernel, devid, GRUB_CFG)]
        oneshot += [
            f"grub-editenv {GRUBENV} set {sh_quote(f'next_entry={entry}')}",
            next_entry_is(entry, GRUBENV),
        ]
        if method == "grub":
            confirm += [no_next_entry(GRUBENV)]
        commit += [f"grub-editenv {GRUBENV} unset next_entry", no_next_entry(GRUBENV)]
        commit += [f"proxmox-boot-tool kernel pin {new}"]
        commit += [grub_default_is(grub_entry(kernel, devid), GRUB_CFG)]
        abandon += [f"grub-editenv {GRUBENV} unset next_entry"]
    return {
        "checks": tuple(checks),
        "pin_running": tuple(pin),
        "prepare": tuple(prepare),
        "oneshot": tuple(oneshot),
        "confirm": tuple(confirm),
        "commit": tuple(commit),
        "abandon": tuple(abandon),
        "deadline_s": deadline_minutes * 60,
        "before_deadline_reboot": tuple(before_reboot),
    }
