"""Brick-safe trial boot of a new kernel: planned from the host's boot path, pure.

With no pin, Proxmox boots the newest installed kernel, so the running kernel is pinned before
the new one is installed; the new kernel then boots exactly once through the boot loader's own
one-shot (systemd-boot's LoaderEntryOneShot, GRUB's next_entry where GRUB can clear it), and
only after the post-boot checks pass is it pinned as the default. A trial that fails in any way
reboots into the pinned kernel. Never ``proxmox-boot-tool kernel pin --next-boot``: a userspace
unit clears that pin, so a kernel that dies before it would boot again and again.

Mechanics and sources: shared/trial-boot.md (section numbers below refer to it).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from facts.boot import (
    BOOT_UUIDS,
    EFIVARS,
    GRUB_CFG,
    GRUBENV,
    LOADER_GUID,
    NEXT_BOOT_PIN,
    BootPathInfo,
)
from facts.proxmox import BootToolStatus
from gpuhost.grammar import KERNEL_RE

METHODS = ("systemd-boot", "grub-esp", "grub", "grub-no-oneshot", "unsupported", "unknown")
APPLICABLE = ("systemd-boot", "grub-esp", "grub", "grub-no-oneshot")

ESP_MOUNTS = "/run/gpuhost/esp"  # never /var/tmp/espmounts: proxmox-boot-tool mounts there
MIB = 1024 * 1024
# Room for one more kernel: a PVE vmlinuz is ~15 MiB, its initramfs (with nvidia) up to ~120 MiB.
MIN_BOOT_FREE = 300 * MIB
MIN_ESP_FREE = 200 * MIB
_ID_PART = re.compile(r"[0-9A-Za-z-]+")  # ESP UUIDs and GRUB devids (fs UUID, ZFS pool GUID)

WAYS_OUT = (
    "move the host to GRUB on an ESP managed by proxmox-boot-tool (proxmox-boot-tool init "
    "<ESP partition> grub; the ESP must not be mounted at /boot/efi), or set "
    "kernel.trial.without_oneshot: true to accept that a new kernel that panics or hangs before "
    "userspace keeps booting until someone at the console or IPMI picks the old kernel"
)


# On the trial boot's command line only, so a boot that came up through the trial entry can be
# told from the fallback even when both run the same kernel. The kernel ignores an unknown
# parameter with a dot in its name (init/main.c unknown_bootoption: "Unused module parameter"),
# so it reaches neither a module nor init.
TRIAL_MARK = "gpuhost.trial=1"
# systemd-boot's trial-only entry and the directory beside it that holds its kernel and
# initramfs: proxmox-boot-tool only writes and deletes proxmox-<kver>.conf and EFI/proxmox/<kver>
# (trial-boot.md §3), so a refresh never touches them and the proxmox-* default never picks them.
TRIAL_ENTRY = "gpuhost-trial.conf"
TRIAL_ESP_DIR = "EFI/gpuhost-trial"
# The trial's initramfs, built by mkinitramfs beside the one update-initramfs keeps: the
# fallback's own initramfs stays as it was until the gate passed.
TRIAL_INITRD_DIR = "/boot/gpuhost-trial"
# The live sysctls the panic parameters set (Documentation/admin-guide/sysctl/kernel.rst:
# panic_on_oops, softlockup_panic, hardlockup_panic, hung_task_panic); the commit puts them back.
PANIC_SYSCTLS = {
    "oops": ("panic_on_oops", "panic"),
    "softlockup_panic": ("softlockup_panic", "1"),
    "nmi_watchdog": ("hardlockup_panic", "panic"),
    "hung_task_panic": ("hung_task_panic", "1"),
}


def trial_cmdline(panic_timeout: int) -> tuple[str, ...]:
    """A trial kernel that panics, oopses, locks up or hangs a task reboots by itself (§3).
    hung_task_panic is on the trial too: guests are stopped during it, so no storage load can
    hold a task in D state for long on a healthy kernel."""
    return (
        f"panic={panic_timeout}",
        "oops=panic",
        "softlockup_panic=1",
        "nmi_watchdog=panic",
        "hung_task_panic=1",
        TRIAL_MARK,
    )


def trial_cmdline_names() -> tuple[str, ...]:
    return tuple(p.split("=", 1)[0] for p in trial_cmdline(0))


def panic_sysctls(cmdline: list[str]) -> dict[str, str]:
    """/proc/sys/kernel values a boot with ``cmdline`` runs with (0 unless a parameter sets it):
    what the Plan expects after a commit from the spec's own parameters (boot.extra)."""
    values = {name: "0" for name, _ in PANIC_SYSCTLS.values()}
    for param in cmdline:
        key, _, value = param.partition("=")
        if key in PANIC_SYSCTLS:
            name, on = PANIC_SYSCTLS[key]
            values[name] = "1" if value == on else "0"
    return values


# Where they go: systemd-boot hosts boot the trial through a trial-only entry (TRIAL_ENTRY) that
# carries the new command line plus these parameters; no other entry ever has them. GRUB's
# next_entry picks one of update-grub's entries, so there they go on the managed command line
# from the run that starts the trial to the one that commits it. Either way the commit sets the
# live sysctls back to what the spec's own parameters ask (panic_sysctls) before guests start.


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
    # driven by the trial record, gpuhost/trialstate.py): seconds after boot for the record,
    # and what its reboot must run first where GRUB cannot clear next_entry itself.
    deadline_s: int = 0
    before_deadline_reboot: tuple[str, ...] = ()
    cmdline: tuple[str, ...] = ()  # on the command line for the trial boot
    notes: tuple[str, ...] = ()
    # systemd-boot: the trial-only entry's options (the planned command line and ``cmdline``);
    # None where the trial boots one of the loader's own entries (GRUB).
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


def systemd_boot_entry(kernel: str) -> str:
    """The entry id systemd-boot matches: the lower-cased file name with .conf (§1.2)."""
    return f"proxmox-{kernel}.conf".lower()


def grub_entry(kernel: str, devid: str) -> str:
    """The GRUB id path of the kernel's entry in the Advanced submenu (§2.2)."""
    return f"gnulinux-advanced-{devid}>gnulinux-{kernel}-advanced-{devid}"


def _q(value: str) -> str:
    return shlex.quote(value)


def _efivar(name: str) -> str:
    return f"{EFIVARS}/{name}-{LOADER_GUID}"


def _efivar_is(name: str, value: str) -> str:
    # efivarfs: 4 attribute bytes, then UTF-16LE; for an ASCII id dropping NULs gives the text.
    return f"test \"$(tail -c +5 {_efivar(name)} | tr -d '\\000')\" = {_q(value)}"


def on_esp(uuid: str, body: str) -> str:
    """Run ``body`` with the ESP mounted at ``$M`` (a private directory), unmounting after."""
    m = f"{ESP_MOUNTS}/{uuid}"
    return (
        f'M={_q(m)}; mkdir -p "$M" && mount -t vfat /dev/disk/by-uuid/{_q(uuid)} "$M" && '
        f'{{ {body}; }}; rc=$?; umount "$M" 2>/dev/null; rmdir "$M" 2>/dev/null; [ "$rc" -eq 0 ]'
    )


def _free_at_least(path: str, size: int) -> str:
    return f'test "$(df -B1 --output=avail {path} | tail -n 1)" -ge {size}'


def _default_is(entry: str) -> str:
    return f'[ "$(awk \'$1 == "default" {{print $2}}\' "$M/loader/loader.conf")" = {_q(entry)} ]'


def _grub_default_is(entry: str, cfg: str) -> str:
    line = f'set default="{entry}"'
    return f"grep -qF {_q(line)} {cfg}"


def _grub_has(kernel: str, devid: str, cfg: str) -> str:
    menuentry_id = f"'gnulinux-{kernel}-advanced-{devid}'"
    return f"grep -qF {_q(menuentry_id)} {cfg}"


def _next_entry_is(entry: str, env: str) -> str:
    return f"grub-editenv {env} list | grep -qxF {_q(f'next_entry={entry}')}"


def _no_next_entry(env: str) -> str:
    # GRUB's save_env leaves "next_entry=" (empty) behind after consuming it.
    return f"! grub-editenv {env} list | grep -q '^next_entry=.'"


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


def trial_entry_method(path: BootPathInfo, tool: BootToolStatus | None) -> bool:
    """Whether this host boots a trial through a trial-only entry (systemd-boot), so a new
    command line or initramfs on the running kernel can be tried with the old one as fallback."""
    return classify(path, tool) == "systemd-boot"


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

    ``options``: the planned command line (systemd-boot's /etc/kernel/cmdline first line), which
    the trial entry boots with while the file itself keeps the fallback's until the commit.
    ``own_entry`` False: the kernel was booted by other means and is only gated and pinned."""
    method = classify(path, tool)
    use_entry = method == "systemd-boot" and own_entry
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
                "(no LoaderInfo EFI variable), so bootctl cannot set a one-shot; boot the host "
                "through systemd-boot first"
            )
    elif method in ("grub", "grub-esp", "grub-no-oneshot"):
        if devid is None or not _ID_PART.fullmatch(devid):
            problems.append(
                f"{GRUB_CFG} has no 'gnulinux-advanced-<id>' submenu id to build the GRUB entry "
                "id from; run update-grub"
            )
            devid = None
        else:
            entry = grub_entry(kernel, devid)
    if running == kernel and not use_entry:
        problems.append(
            "a new command line or initramfs is tried through a trial-only boot entry, which "
            "gpuhost makes on systemd-boot hosts only"
        )
    if method == "grub-no-oneshot" and not without_oneshot:
        reason = path.grubenv_unwritable_by_grub
        problems.append(
            f"no true one-shot on this host: {reason}, so GRUB cannot clear next_entry and a "
            f"trial kernel would stay the default (a panicking one would boot forever). Ways out: "
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
            "or the commit clears it; recovery from a kernel that dies early needs the console"
        )
    refusal = "; ".join(problems) if problems else None
    cmdline = trial_cmdline(panic_timeout)
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
    if base.entry_options is not None:
        steps = _trial_entry_steps(steps, running, kernel, esps, base.entry_options)
    return TrialBoot(**{**base.__dict__, **steps})


def settle_commands(values: dict[str, str]) -> tuple[str, ...]:
    """Set the live panic sysctls to the Plan's values (a trial boot runs with them on)."""
    return tuple(f"echo {_q(v)} > /proc/sys/kernel/{k}" for k, v in sorted(values.items()))


def trial_entry_text(kernel: str, options: str) -> str:
    """systemd-boot's trial-only entry (Boot Loader Specification type #1 keys)."""
    return (
        f"title    gpuhost trial of {kernel}\nversion  {kernel}\noptions  {options}\n"
        f"linux    /{TRIAL_ESP_DIR}/vmlinuz-{kernel}\n"
        f"initrd   /{TRIAL_ESP_DIR}/initrd.img-{kernel}\n"
    )


def _trial_entry_steps(
    steps: dict[str, object], running: str, kernel: str, esps: tuple[str, ...], options: str
) -> dict[str, object]:
    """systemd-boot: the trial boots its own entry, with the new command line and an initramfs
    built for it, while /etc/kernel/cmdline, the proxmox-<kver>.conf entries and the fallback's
    initramfs stay as they were until the commit (trial-boot.md §3)."""
    new = _q(kernel)
    initrd = f"{TRIAL_INITRD_DIR}/initrd.img-{kernel}"
    text = trial_entry_text(kernel, options)
    drop = f'rm -rf "$M/{TRIAL_ESP_DIR}" "$M/loader/entries/{TRIAL_ENTRY}"'
    put = (
        f'{drop} && mkdir -p "$M/{TRIAL_ESP_DIR}" && '
        f'cp /boot/vmlinuz-{new} "$M/{TRIAL_ESP_DIR}/vmlinuz-{kernel}" && '
        f'cp {_q(initrd)} "$M/{TRIAL_ESP_DIR}/initrd.img-{kernel}" && '
        f'printf %s {_q(text)} > "$M/loader/entries/{TRIAL_ENTRY}.new" && '
        f'mv -f "$M/loader/entries/{TRIAL_ENTRY}.new" "$M/loader/entries/{TRIAL_ENTRY}"'
    )
    tidy = [on_esp(u, drop) for u in esps] + [f"rm -rf {TRIAL_INITRD_DIR}"]
    prepare = [
        *steps["prepare"],  # type: ignore[misc]
        f"rm -rf {TRIAL_INITRD_DIR} && mkdir -p {TRIAL_INITRD_DIR}",
        f"mkinitramfs -o {_q(initrd)} {new}",
        *(on_esp(u, put) for u in esps),
    ]
    confirm = [*steps["confirm"], f"grep -qw {_q(TRIAL_MARK)} /proc/cmdline"]  # type: ignore[misc]
    # The tested configuration becomes the kernel's own: its initramfs rebuilt from the same
    # files (the target kernel's only), then pinned and synced; the trial entry goes.
    commit = [f"update-initramfs -u -k {new}"]
    if kernel == running:
        commit += ["proxmox-boot-tool refresh"]
        commit += [on_esp(u, _default_is(systemd_boot_entry(kernel))) for u in esps]
    else:
        commit += list(steps["commit"])  # type: ignore[call-overload]
    return {
        **steps,
        "prepare": tuple(prepare),
        "confirm": tuple(confirm),
        "commit": (*commit, *tidy),
        "abandon": (*steps["abandon"], *tidy),  # type: ignore[misc]
    }


def _steps(
    method: str,
    running: str,
    kernel: str,
    entry: str,
    devid: str | None,
    esps: tuple[str, ...],
    deadline_minutes: int,
) -> dict[str, object]:
    old, new = _q(running), _q(kernel)
    on_esps = esps if method in ("systemd-boot", "grub-esp") else ()

    def every_esp(body: str) -> list[str]:
        return [on_esp(u, body) for u in on_esps]

    checks = [_free_at_least("/boot", MIN_BOOT_FREE)]
    checks += every_esp(_free_at_least('"$M"', MIN_ESP_FREE))
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
        pin += every_esp(_default_is(systemd_boot_entry(running)))
        kentry = systemd_boot_entry(kernel)  # the kernel's own entry, its default after the commit
        if kernel != running:
            prepare += [f"proxmox-boot-tool kernel add {new}", "proxmox-boot-tool refresh"]
        prepare += every_esp(
            f'test -f "$M/loader/entries/{kentry}" && '
            f'test -f "$M/EFI/proxmox/{kernel}/vmlinuz-{kernel}" && '
            + _default_is(systemd_boot_entry(running))
        )
        oneshot += [
            'bootctl set-default ""',  # a LoaderEntryDefault override beats loader.conf
            f"test ! -e {_efivar('LoaderEntryDefault')}",
            f"bootctl set-oneshot {_q(entry)}",
            _efivar_is("LoaderEntryOneShot", entry),  # firmware may refuse the write (§1.7)
        ]
        confirm += [
            _efivar_is("LoaderEntrySelected", entry),
            f"test ! -e {_efivar('LoaderEntryOneShot')}",
        ]
        commit += [f"proxmox-boot-tool kernel pin {new}"]
        commit += [f"proxmox-boot-tool kernel add {old}", f"proxmox-boot-tool kernel remove {new}"]
        commit += ["proxmox-boot-tool refresh"]
        commit += every_esp(_default_is(kentry))
        abandon += ['bootctl set-oneshot ""']
    elif method == "grub-esp":
        assert devid is not None
        cfg = '"$M/grub/grub.cfg"'
        env = '"$M/grub/grubenv"'
        pin += ["proxmox-boot-tool refresh"]
        pin += every_esp(_grub_default_is(grub_entry(running, devid), cfg))
        prepare += [f"proxmox-boot-tool kernel add {new}", "proxmox-boot-tool refresh"]
        prepare += every_esp(_grub_has(kernel, devid, cfg))
        # next_entry on every ESP: whichever the firmware starts consumes its own (§2.4)
        oneshot += every_esp(
            f"grub-editenv {env} set {_q(f'next_entry={entry}')} && {_next_entry_is(entry, env)}"
        )
        commit += every_esp(f"grub-editenv {env} unset next_entry && {_no_next_entry(env)}")
        commit += [f"proxmox-boot-tool kernel pin {new}"]
        commit += [f"proxmox-boot-tool kernel add {old}", f"proxmox-boot-tool kernel remove {new}"]
        commit += ["proxmox-boot-tool refresh"]
        commit += every_esp(_grub_default_is(entry, cfg))
        abandon += every_esp(f"grub-editenv {env} unset next_entry")
    else:  # plain GRUB: `kernel pin` runs update-grub itself (§2.5)
        assert devid is not None
        pin += [_grub_default_is(grub_entry(running, devid), GRUB_CFG)]
        prepare += ["update-grub", _grub_has(kernel, devid, GRUB_CFG)]
        oneshot += [
            f"grub-editenv {GRUBENV} set {_q(f'next_entry={entry}')}",
            _next_entry_is(entry, GRUBENV),
        ]
        if method == "grub":
            confirm += [_no_next_entry(GRUBENV)]
        commit += [f"grub-editenv {GRUBENV} unset next_entry", _no_next_entry(GRUBENV)]
        commit += [f"proxmox-boot-tool kernel pin {new}"]
        commit += [_grub_default_is(entry, GRUB_CFG)]
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
