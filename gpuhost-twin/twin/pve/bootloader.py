"""proxmox-boot-tool, update-grub and update-initramfs of the twin (stdlib only).

Follows proxmox-kernel-helper's bin/proxmox-boot-tool, proxmox-boot/functions, zz-proxmox-boot
and proxmox-boot-sync (formats.md §5), GRUB's grub-mkconfig (sourcing /etc/default/grub and
/etc/default/grub.d/*.cfg) and initramfs-tools' update-initramfs.

The bootloader's view of the world changes only when Proxmox would write it: `refresh` (ESP hosts,
also run by update-initramfs through proxmox-boot-sync) and `update-grub` (GRUB hosts, also run by
`kernel pin/unpin` there). Each writes <root>/var/lib/gpuhost-twin/bootcfg.json in the format
twin/boot.py defines (see its docstring): "loader", "cmdline" (entry options, without the
initrd=/BOOT_IMAGE= the loader adds), "kernel_default", "kernel_next", "kernels" (oldest first,
newest last), "written_by", "written_at"; plus extras the boot may use: "firmware", "loader_default",
"kernel_pin", "entries" (options per kernel), "initrd" (the initramfs records synced to the ESP;
null for GRUB, which reads /boot at boot).

--next-boot, per the source: proxmox-boot-tool writes the one-shot pin into loader.conf `default`
(systemd-boot) or GRUB_DEFAULT exactly like a permanent pin; only proxmox-boot-cleanup.service on
the next boot that reaches multi-user undoes it (on_boot()). So a trial kernel that hangs is booted
again after a power cycle on real hardware. twin/boot.py models a firmware one-shot instead
("kernel_next" falls back to "kernel_default"); "loader_default" says what the loader really holds.
Set "strict_next_boot": true in var/lib/gpuhost-twin/pve.json to record the real behaviour
(kernel_default = the trial kernel, kernel_next = null).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .config import TWIN_STATE

ESP_LIST = "etc/kernel/proxmox-boot-uuids"
MANUAL_KERNEL_LIST = "etc/kernel/proxmox-boot-manual-kernels"
PINNED_KERNEL_CONF = "etc/kernel/proxmox-boot-pin"
NEXT_BOOT_PIN = "etc/kernel/next-boot-pin"
GRUB_PIN_SNIPPET = "etc/default/grub.d/proxmox-kernel-pin.cfg"
KERNEL_CMDLINE = "etc/kernel/cmdline"
BOOTCFG = f"{TWIN_STATE}/bootcfg.json"
ESP_STATE = f"{TWIN_STATE}/esp.json"  # what each ESP holds since the last refresh
TOOL = "/usr/sbin/proxmox-boot-tool"
HOOK = "/etc/kernel/postinst.d/zz-proxmox-boot"


@dataclass
class Out:
    """Collected output of one simulated command."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    rc: int = 0

    def out(self, line: str) -> None:
        self.stdout.append(line)

    def err(self, line: str) -> None:
        self.stderr.append(line)


class Exit(Exception):
    """Stop the simulated script with this exit status (set -e / exit N)."""

    def __init__(self, rc: int) -> None:
        super().__init__(rc)
        self.rc = rc


# --- helpers of proxmox-boot/functions ---


def version_key(version: str) -> list[tuple[int, int | str]]:
    """sort --version-sort, near enough for kernel versions."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.findall(r"\d+|[^\d]+", version)]


def first_line(root: Path, rel: str) -> str:
    try:
        text = (root / rel).read_text()
    except FileNotFoundError:
        return ""
    return text.split("\n", 1)[0]


def installed_kernels(root: Path) -> list[str]:
    """Versions with a /boot/vmlinuz-<ver>, newest first."""
    boot = root / "boot"
    found = (
        [p.name.removeprefix("vmlinuz-") for p in boot.glob("vmlinuz-*")] if boot.is_dir() else []
    )
    return sorted(found, key=version_key, reverse=True)


def running_kernel(root: Path) -> str:
    try:
        return (root / "proc/sys/kernel/osrelease").read_text().strip()
    except FileNotFoundError:
        pass
    try:
        m = re.match(r"Linux version (\S+)", (root / "proc/version").read_text())
    except FileNotFoundError:
        return ""
    return m.group(1) if m else ""


def kernel_keep_versions(root: Path, install_version: str = "") -> list[str]:
    """kernel_keep_versions: running, manual, latest two Proxmox kernels, pins; `sort -u`.

    The twin has no dpkg records of kernel packages, so 'installed Proxmox kernels' are the
    /boot/vmlinuz-*-pve files.
    """
    kernels = [install_version]  # the kernel a package hook was called for
    running = running_kernel(root).lower()
    if running and (root / f"boot/vmlinuz-{running}").exists():
        kernels.append(running)
    manual = root / MANUAL_KERNEL_LIST
    if manual.exists():
        kernels += manual.read_text().split("\n")
    kernels += [k for k in installed_kernels(root) if k.endswith("-pve")][:2]
    kernels += [first_line(root, PINNED_KERNEL_CONF), first_line(root, NEXT_BOOT_PIN)]
    return sorted({k for k in kernels if k})  # plain `sort -u`: lexical, like the tool


def boot_kernel_list(root: Path, install_version: str = "") -> list[str]:
    keep = kernel_keep_versions(root, install_version)
    return [k for k in keep if not re.fullmatch(r"\d+\.\d+", k)]


def esp_uuids(root: Path) -> list[str] | None:
    try:
        text = (root / ESP_LIST).read_text()
    except FileNotFoundError:
        return None
    return [line for line in text.split("\n") if line]


def booted_uefi(root: Path) -> bool:
    return (root / "sys/firmware/efi").is_dir()


def _load_esps(root: Path) -> dict[str, dict[str, object]]:
    try:
        return dict(json.loads((root / ESP_STATE).read_text()))
    except (FileNotFoundError, ValueError):
        return {}


def _write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def initrd_record(root: Path, version: str) -> dict[str, object] | None:
    """The initramfs of a kernel as a record (ours are JSON; others just hashed)."""
    path = root / f"boot/initrd.img-{version}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
        if isinstance(record, dict):
            return record
    except ValueError:
        pass
    return {"sha256": hashlib.sha256(data).hexdigest()}


# --- refresh (zz-proxmox-boot) ---


def refresh(root: Path, out: Out, hook: str | None = None) -> None:
    """`proxmox-boot-tool refresh [--hook <name>]`: run the kernel postinst hooks."""
    hooks = ["proxmox-auto-removal", "zz-proxmox-boot"]
    if hook is not None:
        if hook not in hooks:
            out.err(f"E: '{hook}' is not a valid hook script name.")
            raise Exit(1)
        hooks = [hook]
    for script in hooks:
        path = root / "etc/kernel/postinst.d" / script
        if not (path.is_file() and os.access(path, os.X_OK)):
            out.err(f"Hook script '{script}' not found or not executable, skipping.")
            continue
        out.out(f"Running hook script '{script}'..")
        if script == "zz-proxmox-boot":
            zz_proxmox_boot(root, out, "postinst", "")


def zz_proxmox_boot(root: Path, out: Out, phase: str, version: str) -> None:
    """/etc/kernel/{postinst,postrm}.d/zz-proxmox-boot <version>."""
    out.out(
        f"Re-executing '/etc/kernel/{phase}.d/zz-proxmox-boot' in new private mount namespace.."
    )
    update_esps(root, out, version if phase == "postinst" else "")


KERNEL_HOOKS = {
    "postinst": ("initramfs-tools", "proxmox-auto-removal", "zz-proxmox-boot", "zz-update-grub"),
    "postrm": ("initramfs-tools", "proxmox-auto-removal", "zz-proxmox-boot", "zz-update-grub"),
}


def kernel_hook(root: Path, out: Out, phase: str, name: str, version: str) -> None:
    """What a kernel package's maintainer scripts run (`run-parts /etc/kernel/<phase>.d`)."""
    mode = os.environ.get("DEB_MAINT_PARAMS", "").split(" ")[0].strip("'")
    if mode not in ("", "configure" if phase == "postinst" else "remove"):
        return  # only on configure/remove, like the hooks themselves
    if name == "initramfs-tools":
        if phase == "postinst":
            sub = Out()  # INITRAMFS_TOOLS_KERNEL_HOOK=1: proxmox-boot-sync leaves it to zz-...
            update_initramfs(root, sub, "create", version, from_kernel_hook=True)
            out.stderr += sub.stdout + sub.stderr  # the hook sends update-initramfs to stderr
        else:
            initrd = root / f"boot/initrd.img-{version}"
            if initrd.exists():
                out.err(f"update-initramfs: Deleting /boot/initrd.img-{version}")
                initrd.unlink()
    elif name == "zz-proxmox-boot":
        zz_proxmox_boot(root, out, phase, version)
    elif name == "zz-update-grub" and (root / "boot/grub/grub.cfg").exists():
        update_grub(root, out)


def _esp_cmdline(root: Path, out: Out) -> str:
    cmdline_file = root / KERNEL_CMDLINE
    if cmdline_file.exists():
        cmdline = " ".join(first_line(root, KERNEL_CMDLINE).split())  # echo ${CMDLINE}
        if "root=" not in cmdline:
            out.err("No root= parameter in /etc/kernel/cmdline found!")
            raise Exit(1)
        return cmdline
    out.err("No /etc/kernel/cmdline found - falling back to /proc/cmdline")
    try:
        proc = (root / "proc/cmdline").read_text()
    except FileNotFoundError:
        proc = ""
    return re.sub(r"\binitrd=([0-9a-zA-Z\\/.-])*\s*", "", proc).strip()


def update_esps(root: Path, out: Out, install_version: str = "") -> None:
    uuids = esp_uuids(root)
    if uuids is None:
        out.err(f"No /{ESP_LIST} found, skipping ESP sync.")
        _check_grub_efi_package(root, out)
        return
    cmdline = _esp_cmdline(root, out)
    kvers = boot_kernel_list(root, install_version)
    esps = _load_esps(root)
    for uuid in uuids:
        if not re.search(r"[0-9a-fA-F]{4}-[0-9a-fA-F]{4}", uuid):
            out.err(f"WARN: {uuid} read from /{ESP_LIST} does not look like a VFAT-UUID - skipping")
            continue
        out.err(f"Copying and configuring kernels on /dev/disk/by-uuid/{uuid}")
        synced = []
        for kver in kvers:
            if not (root / f"boot/vmlinuz-{kver}").is_file():
                out.err(f"No linux-image /boot/vmlinuz-{kver} found - skipping")
                continue
            if not (root / f"boot/initrd.img-{kver}").is_file():
                out.err(f"No initrd-image /boot/initrd.img-{kver} found - skipping")
                continue
            out.err(f"\tCopying kernel and creating boot-entry for {kver}")
            synced.append(kver)
        old = esps.get(uuid, {})
        for kver in old.get("versions", []):  # type: ignore[union-attr]
            if not any(kver in k for k in kvers):  # the hook greps, so substrings count
                out.err(f"\tRemoving old version {kver}")
        pinned = first_line(root, PINNED_KERNEL_CONF)
        if (root / NEXT_BOOT_PIN).exists():
            pinned = first_line(root, NEXT_BOOT_PIN)
        esps[uuid] = {
            "mode": "uefi",
            "versions": sorted(synced),  # `ls -1` of EFI/proxmox
            "default": f"proxmox-{pinned}.conf" if pinned else "proxmox-*",
            "cmdline": cmdline,
            "initrd": {k: initrd_record(root, k) for k in synced},
            "synced_at": time.time(),
        }
    _write_json(root / ESP_STATE, esps)
    _write_bootcfg_esp(root, esps, uuids)


def _check_grub_efi_package(root: Path, out: Out) -> None:
    if (
        booted_uefi(root)
        and not (root / "usr/share/doc/grub-efi-amd64/changelog.Debian.gz").exists()
    ):
        out.err("System booted in EFI-mode but grub-efi-amd64 meta-package not installed!")
        out.err("Install grub-efi-amd64 to get updates.")


def _write_bootcfg_esp(root: Path, esps: dict[str, dict[str, object]], uuids: list[str]) -> None:
    """The firmware boots the first ESP; its loader.conf `default` picks the entry."""
    esp = next((esps[u] for u in uuids if u in esps), None)
    versions: list[str] = list(esp["versions"]) if esp else []  # type: ignore[arg-type]
    options = str(esp["cmdline"]) if esp else ""
    write_bootcfg(
        root,
        loader="systemd-boot",
        kernels=versions,
        entries={v: options for v in versions},
        initrd=dict(esp["initrd"]) if esp else {},  # type: ignore[call-overload]
        written_by="proxmox-boot-tool refresh",
    )


def write_bootcfg(
    root: Path,
    loader: str,
    kernels: list[str],
    entries: dict[str, str],
    initrd: dict[str, object] | None,
    written_by: str,
    grub_default: str | None = None,
) -> None:
    """Record what the bootloader now holds (twin/boot.py's bootcfg.json format)."""
    kernels = sorted(kernels, key=version_key)  # oldest first: boot.py takes [-1] as newest
    pin = first_line(root, PINNED_KERNEL_CONF) or None
    next_pin = first_line(root, NEXT_BOOT_PIN) or None
    newest = kernels[-1] if kernels else None

    def bootable(version: str | None) -> str | None:
        return version if version in kernels else None

    if loader == "systemd-boot":  # loader.conf: next-boot pin, else pin, else "proxmox-*"
        loader_default = bootable(next_pin or pin) or newest
    else:
        loader_default = bootable(grub_default) or newest
    if _strict_next_boot(root) or not bootable(next_pin):
        default, next_kernel = loader_default, None
    else:  # boot.py's model: a firmware one-shot entry over the permanent default
        # (GRUB: the default without the pin snippet is approximated by pin, else newest)
        default, next_kernel = bootable(pin) or newest, next_pin
    _write_json(
        root / BOOTCFG,
        {
            "loader": loader,
            "firmware": "uefi" if booted_uefi(root) else "bios",
            "cmdline": entries.get(default or "", ""),
            "kernel_default": default,
            "kernel_next": next_kernel,
            "kernels": kernels,
            "loader_default": loader_default,
            "kernel_pin": pin,
            "entries": entries,
            "initrd": initrd,
            "written_by": written_by,
            "written_at": time.time(),
        },
    )


def _strict_next_boot(root: Path) -> bool:
    try:
        return bool(
            json.loads((root / TWIN_STATE / "pve.json").read_text()).get("strict_next_boot")
        )
    except (FileNotFoundError, ValueError):
        return False


# --- GRUB ---


def grub_settings(root: Path) -> dict[str, str]:
    """Source /etc/default/grub and grub.d/*.cfg with sh, as grub-mkconfig does."""
    names = ("GRUB_DEFAULT", "GRUB_TIMEOUT", "GRUB_DISTRIBUTOR", "GRUB_CMDLINE_LINUX",
             "GRUB_CMDLINE_LINUX_DEFAULT", "GRUB_DISABLE_RECOVERY", "GRUB_DEVICE")  # fmt: skip
    script = (
        'cd "$1" || exit 1\n'
        "if test -f ./etc/default/grub; then . ./etc/default/grub; fi\n"
        'for x in ./etc/default/grub.d/*.cfg; do if [ -e "$x" ]; then . "$x"; fi; done\n'
        + "".join(f'printf "%s\\0" "${{{n}}}"\n' for n in names)
    )
    res = subprocess.run(
        ["sh", "-c", script, "sh", str(root)], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise RuntimeError(res.stderr.strip() or "sourcing /etc/default/grub failed")
    return dict(zip(names, res.stdout.split("\0"), strict=False))


def root_device(root: Path) -> str:
    info = root / TWIN_STATE / "pve.json"
    if info.exists():
        device = json.loads(info.read_text()).get("root_device")
        if device:
            return str(device)
    return "/dev/mapper/pve-root"


def grub_root_id(root: Path) -> str:
    """The id grub-mkconfig embeds in menu entry ids (the root filesystem's UUID)."""
    digest = hashlib.sha256(root_device(root).encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


@dataclass(frozen=True)
class MenuEntry:
    title: str
    id: str
    version: str
    cmdline: str  # as /proc/cmdline shows it (BOOT_IMAGE first)


def update_grub(root: Path, out: Out) -> None:
    """grub-mkconfig -o /boot/grub/grub.cfg (its messages go to stderr)."""
    try:
        settings = grub_settings(root)
    except RuntimeError as exc:
        out.err(str(exc))
        raise Exit(1) from None
    out.err("Generating grub configuration file ...")
    dist = settings.get("GRUB_DISTRIBUTOR") or "Debian"
    os_name = f"{dist} GNU/Linux"
    klass = re.sub(r"[^A-Za-z0-9_]", "_", dist.lower().split(" ")[0])
    rid = grub_root_id(root)
    args = " ".join(f"{settings.get('GRUB_CMDLINE_LINUX', '')} "
                    f"{settings.get('GRUB_CMDLINE_LINUX_DEFAULT', '')}".split())  # fmt: skip
    recovery_args = " ".join(f"single {settings.get('GRUB_CMDLINE_LINUX', '')}".split())
    device = settings.get("GRUB_DEVICE") or root_device(root)
    kernels = installed_kernels(root)
    simple: MenuEntry | None = None
    advanced: list[MenuEntry] = []
    body = ""
    for i, ver in enumerate(kernels):
        out.err(f"Found linux image: /boot/vmlinuz-{ver}")
        initrd = (root / f"boot/initrd.img-{ver}").exists()
        if initrd:
            out.err(f"Found initrd image: /boot/initrd.img-{ver}")
        base = f"BOOT_IMAGE=/boot/vmlinuz-{ver} root={device} ro"
        normal = MenuEntry(f"{os_name}, with Linux {ver}", f"gnulinux-{ver}-advanced-{rid}", ver,
                           f"{base} {args}".strip())  # fmt: skip
        if i == 0:
            simple = MenuEntry(os_name, f"gnulinux-simple-{rid}", ver, normal.cmdline)
            body += _grub_entry(simple, klass, initrd, "")
            body += f"submenu 'Advanced options for {os_name}' $menuentry_id_option 'gnulinux-advanced-{rid}' {{\n"
        advanced.append(normal)
        body += _grub_entry(normal, klass, initrd, "\t")
        if settings.get("GRUB_DISABLE_RECOVERY") != "true":
            rec = MenuEntry(f"{os_name}, with Linux {ver} (recovery mode)",
                            f"gnulinux-{ver}-recovery-{rid}", ver, f"{base} {recovery_args}")  # fmt: skip
            advanced.append(rec)
            body += _grub_entry(rec, klass, initrd, "\t")
    if kernels:
        body += "}\n"
    if booted_uefi(root):
        out.err("Adding boot menu entry for UEFI Firmware Settings ...")
    default = settings.get("GRUB_DEFAULT") or "0"
    cfg_text = (
        "#\n# DO NOT EDIT THIS FILE\n#\n"
        "# It is automatically generated by grub-mkconfig using templates\n"
        "# from /etc/grub.d and settings from /etc/default/grub\n#\n\n"
        "### BEGIN /etc/grub.d/00_header ###\n"
        f'set default="{default}"\n'
        f"set timeout={settings.get('GRUB_TIMEOUT') or '5'}\n"
        "### END /etc/grub.d/00_header ###\n\n"
        "### BEGIN /etc/grub.d/10_linux ###\n"
        f"{body}"
        "### END /etc/grub.d/10_linux ###\n"
    )
    grub_cfg = root / "boot/grub/grub.cfg"
    grub_cfg.parent.mkdir(parents=True, exist_ok=True)
    tmp = grub_cfg.with_name("grub.cfg.new")
    tmp.write_text(cfg_text)
    os.replace(tmp, grub_cfg)
    out.err("done")
    if esp_uuids(root) is not None:
        return  # proxmox-boot-tool manages the ESPs: this grub.cfg is not what boots
    chosen = resolve_grub_default(default, simple, advanced, root)
    normal = [e for e in advanced if "(recovery mode)" not in e.title]
    entries = {e.version: e.cmdline.split(" ", 1)[1] for e in normal}  # without BOOT_IMAGE
    if chosen is not None:
        entries[chosen.version] = chosen.cmdline.split(" ", 1)[1]  # a recovery default counts
    write_bootcfg(
        root,
        loader="grub",
        kernels=kernels,
        entries=entries,
        initrd=None,
        written_by="update-grub",
        grub_default=chosen.version if chosen else None,
    )


def _grub_entry(entry: MenuEntry, klass: str, initrd: bool, indent: str) -> str:
    kernel_args = entry.cmdline.split(" ", 1)[1]  # without BOOT_IMAGE, which GRUB adds
    text = (
        f"{indent}menuentry '{entry.title}' --class {klass} --class gnu-linux --class gnu "
        f"--class os $menuentry_id_option '{entry.id}' {{\n"
        f"{indent}\techo\t'Loading Linux {entry.version} ...'\n"
        f"{indent}\tlinux\t/boot/vmlinuz-{entry.version} {kernel_args}\n"
    )
    if initrd:
        text += f"{indent}\techo\t'Loading initial ramdisk ...'\n"
        text += f"{indent}\tinitrd\t/boot/initrd.img-{entry.version}\n"
    return text + f"{indent}}}\n"


def resolve_grub_default(
    default: str, simple: MenuEntry | None, advanced: list[MenuEntry], root: Path
) -> MenuEntry | None:
    """What GRUB boots for GRUB_DEFAULT (unknown entries fall back to entry 0)."""
    if simple is None:
        return None
    if default == "saved":
        env = root / "boot/grub/grubenv"
        m = re.search(r"^saved_entry=(.*)$", env.read_text(), re.M) if env.exists() else None
        default = m.group(1) if m else "0"
    parts = default.split(">")
    top = parts[0]
    if top in ("0", simple.id, simple.title) and len(parts) == 1:
        return simple
    if (
        top
        in (
            "1",
            f"Advanced options for {simple.title}",
            simple.id.replace("simple", "advanced"),
        )
        and len(parts) == 2
    ):
        for i, entry in enumerate(advanced):
            if parts[1] in (str(i), entry.id, entry.title):
                return entry
    return simple


def set_grub_default(root: Path, out: Out, kver: str) -> None:
    """set_grub_default: write the pin snippet (GRUB_DEFAULT=<submenu id>><entry id>)."""
    snippet = root / GRUB_PIN_SNIPPET
    if not kver:
        snippet.unlink(missing_ok=True)
        return
    grub_cfg = root / "boot/grub/grub.cfg"
    devid = ""
    if grub_cfg.exists():
        for line in grub_cfg.read_text().splitlines():
            m = re.match(r".*gnulinux-advanced-(.+)['] \{$", line)
            if m:
                devid = m.group(1)
    else:
        out.err("sed: can't read /boot/grub/grub.cfg: No such file or directory")
    entry = f"gnulinux-advanced-{devid}>gnulinux-{kver}-advanced-{devid}"
    snippet.parent.mkdir(parents=True, exist_ok=True)
    snippet.write_text(f'GRUB_DEFAULT="{entry}"\n')


# --- proxmox-boot-tool kernel ... / status ---


def _possible_versions(root: Path, out: Out) -> None:
    out.err("")
    out.err("Possible Proxmox kernel versions are:")
    out.err("\n".join(boot_kernel_list(root)))


def pin_kernel(root: Path, out: Out, ver: str, next_boot: bool) -> None:
    pin_file = NEXT_BOOT_PIN if next_boot else PINNED_KERNEL_CONF
    if not ver:
        out.err("E: <kernel-version> is mandatory")
        _possible_versions(root, out)
        raise Exit(1)
    if not (root / f"boot/vmlinuz-{ver}").exists():
        out.err(f"E: no kernel image found in /boot for '{ver}', not setting default.")
        _possible_versions(root, out)
        raise Exit(1)
    if (root / pin_file).exists():
        old = first_line(root, pin_file)
        if old != ver:
            out.out(f"Overriding previously pinned version '{old}' with '{ver}'")
    (root / pin_file).parent.mkdir(parents=True, exist_ok=True)
    (root / pin_file).write_text(ver + "\n")
    if (root / ESP_LIST).is_file():
        out.out(f"Set kernel '{ver}' in /{pin_file}. Use the 'refresh' command to update the ESPs.")
    else:
        pin_ver = first_line(root, NEXT_BOOT_PIN) or ver
        out.out(f"Setting '{pin_ver}' as grub default entry and running update-grub.")
        set_grub_default(root, out, pin_ver)
        update_grub(root, out)


def unpin_kernel(root: Path, out: Out, next_boot_only: bool) -> None:
    last_pin = first_line(root, NEXT_BOOT_PIN)
    (root / NEXT_BOOT_PIN).unlink(missing_ok=True)
    out.out(f"Removed /{NEXT_BOOT_PIN}.")
    if not next_boot_only:
        last_pin = first_line(root, PINNED_KERNEL_CONF) or last_pin
        (root / PINNED_KERNEL_CONF).unlink(missing_ok=True)
        out.out(f"Removed /{PINNED_KERNEL_CONF}.")
    if (root / ESP_LIST).is_file():
        if last_pin:
            out.out(f"Unpinned kernel '{last_pin}'. Use the 'refresh' command to update the ESPs.")
    else:
        out.out("Reset default grub entry and running update-grub.")
        set_grub_default(root, out, first_line(root, PINNED_KERNEL_CONF))
        update_grub(root, out)


def list_kernels(root: Path, out: Out) -> None:
    boot_kernels = boot_kernel_list(root)
    manual: list[str] = []
    manual_file = root / MANUAL_KERNEL_LIST
    if manual_file.exists():
        manual = [k for k in manual_file.read_text().split("\n") if k]
        boot_kernels = [k for k in boot_kernels if k not in manual]
    out.out("Manually selected kernels:")
    out.out("\n".join(manual) if manual else "None.")
    out.out("")
    out.out("Automatically selected kernels:")
    out.out("\n".join(boot_kernels))
    pinned, nextboot = first_line(root, PINNED_KERNEL_CONF), first_line(root, NEXT_BOOT_PIN)
    if pinned:
        out.out("")
        out.out("Pinned kernel:")
        out.out(pinned)
    if nextboot:
        out.out("")
        out.out("Kernel pinned on next-boot:")
        out.out(nextboot)


def add_kernel(root: Path, out: Out, ver: str) -> None:
    if not ver:
        out.err("E: <kernel-version> is mandatory")
        out.err("")
        raise Exit(1)
    if not (root / f"boot/vmlinuz-{ver}").exists():
        out.err(f"E: no kernel image found in /boot for '{ver}', not adding.")
        raise Exit(1)
    path = root / MANUAL_KERNEL_LIST
    entries = set(path.read_text().split("\n")) if path.exists() else set()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{k}\n" for k in sorted((entries | {ver}) - {""})))
    out.out(
        f"Added kernel '{ver}' to manual kernel list. Use the 'refresh' command to update the ESPs."
    )


def remove_kernel(root: Path, out: Out, ver: str) -> None:
    if not ver:
        out.err("E: <kernel-version> is mandatory")
        out.err("")
        raise Exit(1)
    path = root / MANUAL_KERNEL_LIST
    entries = path.read_text().split("\n") if path.exists() else []
    if ver in entries:
        path.write_text("".join(f"{k}\n" for k in entries if k and k != ver))
        out.out(
            f"Removed kernel '{ver}' from manual kernel list. Use the 'refresh' command to update the ESPs."
        )
    else:
        out.out(f"Kernel '{ver}' not found in manual kernel list.")


def status(root: Path, out: Out, quiet: bool) -> None:
    if not quiet:
        out.out(f"Re-executing '{TOOL}' in new private mount namespace..")
    uuids = esp_uuids(root)
    if uuids is None:
        if not quiet:
            out.err(f"E: /{ESP_LIST} does not exist.")
        raise Exit(2)
    if quiet:
        return
    out.out(f"System currently booted with {'uefi' if booted_uefi(root) else 'legacy bios'}")
    esps = _load_esps(root)
    for uuid in uuids:
        if not re.search(r"[0-9a-fA-F]{4}-[0-9a-fA-F]{4}", uuid):
            out.err(f"WARN: {uuid} read from /{ESP_LIST} does not look like a VFAT-UUID - skipping")
            continue
        esp = esps.get(uuid, {"mode": "uefi", "versions": []})
        versions = ", ".join(esp["versions"])  # type: ignore[arg-type]
        out.out(f"{uuid} is configured with: {esp['mode']} (versions: {versions})")


# --- update-initramfs ---

INITRAMFS_SOURCES = ("etc/modprobe.d", "etc/modules-load.d", "etc/modules", "etc/initramfs-tools")


def initramfs_record(root: Path, version: str) -> dict[str, object]:
    """What the twin's initrd 'contains': the module configuration at generation time."""
    files: dict[str, str] = {}
    for rel in INITRAMFS_SOURCES:
        base = root / rel
        paths = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else [base]
        for path in paths:
            if path.is_file():
                files["/" + str(path.relative_to(root))] = path.read_text(errors="replace")
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {
        "generator": "gpuhost-twin update-initramfs",
        "kernel": version,
        "generated_at": time.time(),
        "sha256": digest,
        "files": files,
    }


def update_initramfs(
    root: Path, out: Out, mode: str, version: str | None, from_kernel_hook: bool = False
) -> None:
    """update-initramfs -u|-c [-k <ver>|all]; each generation runs proxmox-boot-sync."""
    kernels = installed_kernels(root)
    with_initrd = [k for k in kernels if (root / f"boot/initrd.img-{k}").exists()]
    if version == "all":
        targets = with_initrd if mode == "update" else kernels
    elif version:
        targets = [version]
    else:
        targets = with_initrd[:1]  # the highest version with an initramfs
        if not targets:
            return  # "Nothing to do, exiting."
    for ver in targets:
        initrd = root / f"boot/initrd.img-{ver}"
        if mode == "update" and not initrd.exists():
            out.err(f"/boot/initrd.img-{ver} does not exist. Cannot update.")
            return  # initramfs-tools' mild_panic: message and exit 0
        if not (root / f"boot/vmlinuz-{ver}").exists() and mode == "create":
            out.err(f"update-initramfs: /boot/vmlinuz-{ver} does not exist. Cannot create.")
            raise Exit(1)
        out.out(f"update-initramfs: Generating /boot/initrd.img-{ver}")
        initrd.parent.mkdir(parents=True, exist_ok=True)
        initrd.write_text(json.dumps(initramfs_record(root, ver), indent=1) + "\n")
        if not (from_kernel_hook or os.environ.get("INITRAMFS_TOOLS_KERNEL_HOOK")):
            refresh(
                root, out, hook="zz-proxmox-boot"
            )  # /etc/initramfs/post-update.d/proxmox-boot-sync


# --- boot-time hook ---


def on_boot(root: Path) -> Out:
    """proxmox-boot-cleanup.service: after a boot, drop the one-shot pin and refresh.

    Call after the simulated boot has chosen the kernel (ConditionPathExists=next-boot-pin).
    """
    out = Out()
    if not (root / NEXT_BOOT_PIN).exists():
        return out
    try:
        unpin_kernel(root, out, next_boot_only=True)
        refresh(root, out)
    except Exit as exc:
        out.rc = exc.rc
    return out
