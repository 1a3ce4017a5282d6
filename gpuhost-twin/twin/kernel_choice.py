"""What the firmware and boot loader boot: the kernel and its command line (stdlib plus twin).

Boot configuration snapshot: /var/lib/gpuhost-twin/bootcfg.json
----------------------------------------------------------------
A real boot loader boots what the last `proxmox-boot-tool refresh` / `update-grub` wrote, not what
/etc says now. The Proxmox tool shims record that snapshot whenever they run; its format:

    {
      "loader": "systemd-boot" | "grub" | "none",  # none: never read (twin/kernel_direct.py)
      "cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on",
                 # the options of the boot entry: /etc/kernel/cmdline (systemd-boot), or for grub
                 # "root=<dev> ro $GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT"
      "kernel_default": "6.8.12-9-pve" | null,   # the loader's default: loader.conf `default`
                 # (next-boot pin, else pin, else proxmox-* = newest) or GRUB_DEFAULT; null = newest
      "kernels": ["6.8.12-9-pve", "6.14.8-2-bpo12-pve"],  # kernels with boot entries
      "entries": {"6.8.12-9-pve": "root=..."},   # optional: options per kernel entry
      "initrd": {"6.8.12-9-pve": {"files": {...}}},  # optional: initramfs synced to the ESP
      "grub_devid": "…",                          # optional: <devid> of GRUB's menu entry ids
      "grub_on_esp": ["9B1C-4F2A"],               # optional: GRUB lives on these ESPs
      "menu": {"gpuhost-trial": {"title": "...", "linux": "/boot/vmlinuz-<kver>", "options": "...",
               "initrd": "/boot/..."}},   # optional: other /etc/grub.d scripts' top-level entries
      "written_by": "proxmox-boot-tool refresh", "written_at": 1764439200.0
    }

Without the snapshot the config files are read directly: /etc/kernel/{next-boot-pin,
proxmox-boot-pin,cmdline} for systemd-boot; /etc/default/grub + /etc/default/grub.d/*.cfg
(GRUB_DEFAULT from proxmox-kernel-pin.cfg) for GRUB; else the newest /boot/vmlinuz-*.

One-shots (docs/reference/trial-boot.md §1.3, §2.1, §2.3), consumed before the kernel starts:
- systemd-boot: EFI variable LoaderEntryOneShot (deleted on read), then LoaderEntryDefault, then
  the snapshot's default, then the first (newest) entry. IDs are glob-matched against
  `proxmox-<kver>.conf`; one that matches nothing falls through. LoaderEntrySelected = the booted ID.
- GRUB: next_entry of the grubenv GRUB loads (the first ESP's on GRUB-on-ESP hosts, else
  /boot/grub/grubenv) is cleared by save_env, except on /boot on LVM (profile boot.boot_on_lvm),
  where the write fails and the entry sticks. next_entry may name (by id or title) a top-level
  entry another /etc/grub.d script printed: it boots that entry's linux, options and initrd.
  An unknown id boots entry 0, the newest kernel.
proxmox-boot-tool's --next-boot is no one-shot: it is the loader default until
proxmox-boot-cleanup.service runs in a boot that reaches userspace (twin.pve.on_boot).

A kernel without zfs.ko booted with root=ZFS= stops in its initramfs (hwsim/storage.py): like a
panic, panic=N reboots it and without it the host waits at the prompt.
A kernel in the profile's failing_kernels panics at boot, and so does one whose nvidia module
loads at boot against GSP firmware of another release when oops=panic turns its oops into a
panic (gsp_mismatch; without it the module fails to load): with panic=N (N>0) on its command line
it reboots into whatever the loader picks next (one-shots already consumed); without it, it
hangs. Both are recorded in hw.json "boot_attempts"; a hang or a reboot loop raises BrickedError.
"""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

from twin import boot_stop, hwsim
from twin.hwsim import efivars, grubenv, storage
from twin.initrd import BOOTCFG, initramfs_of
from twin.profile import Profile

START_KERNEL = "var/lib/gpuhost-twin/start-kernel"  # twin/startstate.py: the first boot's
ESP_DIR = "var/lib/gpuhost-twin/esp"  # what each ESP's vfat holds that the twin keeps as files
LOADER_INFO = "systemd-boot 252.39-1~deb12u2"
MAX_BOOTS = 5  # a panic loop this long counts as bricked (a real one never ends)


class BrickedError(RuntimeError):
    """The host would not come back by itself: a hang, or a kernel panic reboot loop."""


def choose_kernel(hw: hwsim.Hw, profile: Profile) -> tuple[str, str, list[dict]]:
    installed = hw.installed_kernels()
    if not installed:
        raise BrickedError("no kernel image in /boot: the bootloader has nothing to boot")
    cfg = _bootcfg(hw, profile, installed)
    if profile.boot.firmware == "uefi":
        hw.p(efivars.EFIVARS).mkdir(parents=True, exist_ok=True)
    attempts: list[dict] = []
    for _ in range(MAX_BOOTS):
        kernel = _select(hw, profile, cfg, installed)
        options = cfg["entries"].get(kernel) or cfg["cmdline"]
        cmdline = _full_cmdline(profile, cfg, kernel, options)
        own = hw.state.pop("boot_entry", None)  # an entry of its own on the ESP (not proxmox-*)
        hw.state.pop("boot_initrd", None)
        if own is not None:
            kernel = own["version"]
            head = own.get("head") or _initrd_arg(own["initrd"])  # GRUB: BOOT_IMAGE=
            cmdline = " ".join([head, *own["options"].split()])
            hw.state["boot_initrd"] = own["initrd"]  # boot_modules reads this initramfs
        why = "profile" if kernel in profile.failing_kernels else ""
        if not why and storage.root_on_zfs(cmdline) and not storage.kernel_has_zfs(hw.root, kernel):
            why = "zfs"  # the initramfs cannot import the root pool (hwsim/storage.py)
        if not why and "oops=panic" in cmdline.split():  # else the oops kills modules-load only
            why = gsp_mismatch(hw, kernel)
        if not why and not boot_stop.stops(cmdline, initramfs_of(hw, kernel)):
            attempts.append({"kernel": kernel, "result": "booted"})
            return kernel, cmdline, attempts
        if not why:  # userspace stops before anything can confirm the boot (twin/boot_stop.py)
            _stopped(hw, kernel, cmdline, attempts)
            continue
        hw.state["panic_log"] = boot_stop.panic_log(kernel, cmdline, why)
        timeout = panic_timeout(cmdline)
        if timeout <= 0:
            attempts.append({"kernel": kernel, "result": "panicked; hung (no panic=N)"})
            _record(hw, attempts)
            raise BrickedError(f"kernel {kernel} panics and hangs without panic=N: host bricked")
        attempts.append({"kernel": kernel, "result": f"panicked; rebooted (panic={timeout})"})
    _record(hw, attempts)
    raise BrickedError(
        f"reboot loop: the loader keeps booting {attempts[-1]['kernel']}, which panics: host bricked"
    )


def _stopped(hw: hwsim.Hw, kernel: str, cmdline: str, attempts: list[dict]) -> None:
    """A boot that stops in the initramfs shell or systemd's emergency or rescue mode."""
    log, result, bricked = boot_stop.stopped(kernel, cmdline, initramfs_of(hw, kernel))
    hw.state["panic_log"] = log
    attempts.append({"kernel": kernel, "result": result})
    if bricked:
        _record(hw, attempts)
        raise BrickedError(bricked)


def gsp_mismatch(hw: hwsim.Hw, kernel: str) -> str:
    """Why this kernel's boot panics in the nvidia module, or '' (the operator's kpro6: GSP
    firmware of another version than the module): the module loads at boot (modules-load.d)
    and /lib/firmware/nvidia/<its version>/ holds blobs of a different release."""
    loads = any(
        "nvidia" in f.read_text().split()
        for f in sorted(hw.p("etc/modules-load.d").glob("*.conf"))
        if hw.p("etc/modules-load.d").is_dir()
    )
    ko = hw.find_ko("nvidia", kernel) if loads else None
    return hw.gsp_mismatch(hwsim.ko_info(ko).get("version", "")) if ko is not None else ""


def _record(hw: hwsim.Hw, attempts: list[dict]) -> None:
    hw.state["boot_attempts"] = attempts
    hw.save()


def panic_timeout(cmdline: str) -> int:
    """The kernel's panic= (the last one wins); 0 = wait forever."""
    value = 0
    for word in cmdline.split():
        if word.startswith("panic="):
            try:
                value = int(word.removeprefix("panic="))
            except ValueError:
                value = 0
    return value


def _select(hw: hwsim.Hw, profile: Profile, cfg: dict, installed: list[str]) -> str:
    entries = [k for k in cfg["kernels"] if k in installed] or installed
    newest = sorted(entries, key=hwsim.version_key)[-1]
    default = cfg["kernel_default"] if cfg["kernel_default"] in entries else newest
    # A twin made from a capture boots the kernel the host ran, once (twin/startstate.py).
    start = hw.p(START_KERNEL)
    first = start.read_text().strip() if start.exists() else None
    start.unlink(missing_ok=True)
    if first is not None and first in entries:
        default = first
    if cfg["loader"] == "systemd-boot":
        esp = hw.root / ESP_DIR / profile.boot.esp_uuids[0] if profile.boot.esp_uuids else None
        kernel, own = _systemd_boot(hw.root, entries, default, esp)
        if own is not None:
            hw.state["boot_entry"] = own
        return kernel
    kernel, own = _grub(hw.root, profile, cfg, entries, default, newest)
    if own is not None:
        hw.state["boot_entry"] = own
    return kernel


def _systemd_boot(
    root: Path, entries: list[str], default: str, esp: Path | None
) -> tuple[str, dict | None]:
    """boot.c: the one-shot is deleted as it is read, before any entry starts. Entries are the
    proxmox-<kver>.conf ones of the refresh plus any other loader/entries/*.conf on the ESP the
    firmware starts (the first), which a one-shot or LoaderEntryDefault may name; an entry whose
    `linux` file is missing on that ESP is skipped (boot.c L1550-1554)."""
    efivars.firmware_set(root, "LoaderInfo", LOADER_INFO)
    efivars.firmware_set(root, "LoaderFirmwareType", "UEFI 2.70")
    efivars.firmware_set(root, "LoaderFirmwareInfo", "American Megatrends 5.27")
    oneshot = efivars.read_string(root, "LoaderEntryOneShot")
    efivars.firmware_set(root, "LoaderEntryOneShot", None)
    ids = sorted(entries, key=hwsim.version_key, reverse=True)  # descending version order
    own = _own_entries(esp)
    for pattern in (oneshot, efivars.read_string(root, "LoaderEntryDefault")):
        if not pattern:
            continue
        match = next((k for k in ids if fnmatch.fnmatchcase(entry_id(k), pattern)), None)
        if match:
            efivars.firmware_set(root, "LoaderEntrySelected", entry_id(match))
            return match, None
        other = next((i for i in sorted(own) if fnmatch.fnmatchcase(i, pattern)), None)
        if other is not None:
            efivars.firmware_set(root, "LoaderEntrySelected", other)
            return own[other]["version"], own[other]
    efivars.firmware_set(root, "LoaderEntrySelected", entry_id(default))
    return default, None


def _own_entries(esp: Path | None) -> dict[str, dict]:
    """Bootable loader/entries/*.conf on ``esp`` other than proxmox-*.conf: id -> its keys
    (version from the `linux` file name vmlinuz-<kver>, options, initrd path on the ESP)."""
    found: dict[str, dict] = {}
    top = esp / "loader/entries" if esp is not None else None
    if top is None or not top.is_dir():
        return found
    for path in top.glob("*.conf"):
        if path.name.startswith("proxmox-"):
            continue
        keys: dict[str, str] = {}
        for line in path.read_text().splitlines():
            key, _, value = line.strip().partition(" ")
            keys.setdefault(key, value.strip())
        linux = keys.get("linux", "")
        m = re.fullmatch(r"/?(?:\S*/)?vmlinuz-(\S+)", linux)
        if m is None or not (esp / linux.lstrip("/")).is_file():
            continue
        initrd = keys.get("initrd", "")
        found[path.name.lower()] = {
            "version": m.group(1),
            "options": keys.get("options", ""),
            "initrd": str(esp / initrd.lstrip("/")) if initrd else "",
        }
    return found


def _initrd_arg(path: str) -> str:
    """initrd= as systemd-boot puts it first on the command line (backslashes, ESP-relative)."""
    rel = path.split(f"/{ESP_DIR}/", 1)[-1].split("/", 1)[-1] if path else ""
    return "initrd=\\" + rel.replace("/", "\\")


def entry_id(kernel: str) -> str:
    return f"proxmox-{kernel}.conf".lower()


def grubenv_path(root: Path, cfg: dict) -> tuple[Path, bool]:
    """The grubenv GRUB loads at boot and whether its save_env can write it."""
    esps = cfg.get("grub_on_esp") or []
    if esps:  # the firmware starts the first ESP's GRUB; vfat on a plain partition is writable
        return Path(root) / ESP_DIR / esps[0] / "grub/grubenv", True
    return Path(root) / "boot/grub/grubenv", False


GRUB_BLI_INFO = "GRUB 2.12"  # Debian 13's grub2 2.12 PACKAGE_STRING


def _grub(
    root: Path, profile: Profile, cfg: dict, entries: list[str], default: str, newest: str
) -> tuple[str, dict | None]:
    """The kernel GRUB boots and, for a menu entry of another /etc/grub.d script that
    next_entry names, that entry (its own linux, options and initrd)."""
    esps = cfg.get("grub_on_esp") or []
    base = Path(root) / ESP_DIR / esps[0] if esps else Path(root)  # GRUB's root device
    if efivars.uefi(root):  # volatile Boot Loader Interface variables go with the reboot
        for name in ("LoaderInfo", "LoaderEntrySelected", "LoaderFirmwareType"):
            efivars.firmware_set(root, name, None)
        # GRUB 2.06 (Debian 12) sets none. Debian 13's /etc/grub.d/25_bli puts `insmod bli` into
        # grub.cfg on EFI, and GRUB 2.12's bli module sets LoaderInfo to its PACKAGE_STRING as it
        # loads (grub-core/commands/bli.c, GRUB_MOD_INIT): a Boot Loader Interface loader
        # without LoaderEntryOneShot.
        grub_cfg = base / ("grub/grub.cfg" if esps else "boot/grub/grub.cfg")
        if grub_cfg.is_file() and "insmod bli" in grub_cfg.read_text(errors="replace"):
            efivars.firmware_set(root, "LoaderInfo", GRUB_BLI_INFO)
    path, writable = grubenv_path(root, cfg)
    if not cfg.get("grub_on_esp"):
        writable = not profile.boot.boot_on_lvm
    env = grubenv.read(path)
    target = env.get("next_entry")
    if not target:
        return default, None
    if writable:  # 00_header: set next_entry= ; save_env next_entry
        env["next_entry"] = ""
        grubenv.write(path, env)
    own = _menu_entry(base, cfg.get("menu") or {}, target)
    if own is not None and own.get("unloadable"):
        # its linux/initrd fail (GRUB 2.06, tests/vm): gpuhost's entry reboots into the default
        if own.get("on_failure") != "reboot":  # else "Press any key to continue..."
            raise BrickedError(f"GRUB cannot load {target!r} and waits for a key at the console")
        return default, None
    if own is not None:
        return own["version"], own
    return resolve_grub_id(target, entries, cfg.get("grub_devid"), newest), None


def _menu_entry(base: Path, menu: dict, target: str) -> dict | None:
    """A top-level entry of another /etc/grub.d script named by its id or title (grub.texi: a
    menu item is a number, a title or an id), bootable when its linux and initrd files exist
    on GRUB's root device (``base``: the root fs, or the ESP GRUB starts from); GRUB puts
    BOOT_IMAGE=<the linux path> first on the command line (include/grub/lib/cmdline.h)."""
    entry = menu.get(target) or next((e for e in menu.values() if e["title"] == target), None)
    if entry is None:
        return None
    m = re.fullmatch(r"(?:/boot)?/vmlinuz-(\S+)", entry["linux"])
    files = [entry["linux"], *([entry["initrd"]] if entry["initrd"] else [])]
    if m is None:
        return None
    if not all((base / f.lstrip("/")).is_file() for f in files):
        return {"unloadable": True, "on_failure": entry.get("on_failure", "")}
    initrd = str(base / entry["initrd"].lstrip("/")) if entry["initrd"] else ""
    head = f"BOOT_IMAGE={entry['linux']}"
    return {"version": m.group(1), "options": entry["options"], "initrd": initrd, "head": head}


def resolve_grub_id(target: str, entries: list[str], devid: str | None, newest: str) -> str:
    """A menu path of ids (10_linux); anything unknown is entry 0, the newest kernel."""
    m = re.fullmatch(r"gnulinux-advanced-(.+)>gnulinux-(.+)-advanced-(.+)", target)
    same_dev = m is not None and m.group(1) == m.group(3) and devid in (None, m.group(1))
    if m and same_dev and m.group(2) in entries:
        return m.group(2)
    return newest


def _bootcfg(hw: hwsim.Hw, profile: Profile, installed: list[str]) -> dict:
    path = hw.p(BOOTCFG)
    if path.exists():
        cfg = json.loads(path.read_text())
        return {
            "loader": cfg.get("loader") or profile.boot.loader,
            "cmdline": cfg.get("cmdline", ""),
            "kernel_default": cfg.get("kernel_default"),
            "kernels": cfg.get("kernels") or installed,
            "entries": cfg.get("entries") or {},  # options per kernel, when the writer gives them
            "grub_devid": cfg.get("grub_devid"),
            "grub_on_esp": cfg.get("grub_on_esp") or [],
            "menu": cfg.get("menu") or {},  # GRUB: other /etc/grub.d scripts' top-level entries
        }
    # --next-boot's pin wins in loader.conf, like a permanent pin
    pin = _first_line(hw.p("etc/kernel/next-boot-pin")) or _first_line(
        hw.p("etc/kernel/proxmox-boot-pin")
    )
    if profile.boot.loader == "systemd-boot":
        cmdline = _first_line(hw.p("etc/kernel/cmdline")) or ""
    else:
        grub = read_default_grub(hw.root)
        m = re.search(r">gnulinux-(\S+?)-advanced-|with Linux (\S+)", grub.get("GRUB_DEFAULT", ""))
        pin = (m.group(1) or m.group(2)) if m else pin
        cmdline = " ".join(
            [
                "root=/dev/mapper/pve-root",
                "ro",
                grub.get("GRUB_CMDLINE_LINUX", ""),
                grub.get("GRUB_CMDLINE_LINUX_DEFAULT", ""),
            ]
        )
    return {
        "loader": profile.boot.loader,
        "cmdline": cmdline,
        "kernel_default": pin,
        "kernels": installed,
        "entries": {},
        "grub_devid": None,
        "grub_on_esp": list(profile.boot.esp_uuids) if profile.boot.grub_on_esp else [],
    }


def _full_cmdline(profile: Profile, cfg: dict, kernel: str, options: str) -> str:
    """What the loader hands the kernel: systemd-boot adds initrd=, GRUB adds BOOT_IMAGE=."""
    if cfg["loader"] == "systemd-boot":
        head = f"initrd=\\EFI\\proxmox\\{kernel}\\initrd.img-{kernel}"
    elif cfg.get("grub_on_esp"):
        head = f"BOOT_IMAGE=/vmlinuz-{kernel}"  # the ESP is GRUB's /boot
    else:
        head = f"BOOT_IMAGE=/boot/vmlinuz-{kernel}"
    return " ".join([head, *options.split()])


def read_default_grub(root: Path) -> dict[str, str]:
    """/etc/default/grub then /etc/default/grub.d/*.cfg as shell assignments ($VAR expanded)."""
    values: dict[str, str] = {}
    files = [root / "etc/default/grub", *sorted((root / "etc/default/grub.d").glob("*.cfg"))]
    for f in files:
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            m = re.match(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
            if not m:
                continue
            raw = m.group(2).strip()
            if raw.startswith("'") and raw.endswith("'"):
                values[m.group(1)] = raw[1:-1]
                continue
            raw = raw[1:-1] if raw.startswith('"') and raw.endswith('"') else raw
            values[m.group(1)] = re.sub(
                r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda v: values.get(v.group(1), ""), raw
            )
    return values


def _first_line(path: Path) -> str | None:
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    return lines[0].strip() if lines and lines[0].strip() else None
