"""update-grub (grub-mkconfig sourcing /etc/default/grub and /etc/default/grub.d/*.cfg, running
/etc/grub.d) and GRUB_DEFAULT pinning through proxmox-kernel-pin.cfg (stdlib only).

grub-common's own /etc/grub.d scripts are rendered here (00_header, 10_linux; the others print
no entry on a PVE host); any other executable script runs as grub-mkconfig runs it
(util/grub-mkconfig.in: every executable non-garbage file of /etc/grub.d in name order, under
`set -e`, with GRUB_* and pkgdatadir exported), its output spliced in at its place by name, and
its top-level menu entries recorded for the boot (bootcfg "menu")."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .boot_functions import (
    GRUB_PIN_SNIPPET,
    Exit,
    Out,
    booted_uefi,
    esp_uuids,
    installed_kernels,
)
from .bootcfg import write_bootcfg
from .state import TWIN_STATE

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


def update_grub(root: Path, out: Out, esps: list[str] | None = None) -> None:
    """grub-mkconfig -o /boot/grub/grub.cfg (its messages go to stderr).

    esps: proxmox-boot-tool's refresh on GRUB-on-ESP hosts, which renders the same config onto
    every ESP (the ESP bind-mounted on /boot); only then is the result what boots.
    """
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
    try:
        before, after = _scripts(root, {**settings, "GRUB_DEVICE": device})
    except RuntimeError as exc:
        out.err(str(exc))
        raise Exit(1) from None
    menu = {**menu_entries(before), **menu_entries(after)}
    if esps:  # rendered with the ESP on /boot: paths relative to the ESP (write_grub_esp)
        menu = {k: {**v, "linux": _esp_path(v["linux"]), "initrd": _esp_path(v["initrd"])}
                for k, v in menu.items()}  # fmt: skip
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
        f"{before}"
        "### BEGIN /etc/grub.d/10_linux ###\n"
        f"{body}"
        "### END /etc/grub.d/10_linux ###\n"
        f"{after}"
    )
    grub_cfg = root / "boot/grub/grub.cfg"
    grub_cfg.parent.mkdir(parents=True, exist_ok=True)
    tmp = grub_cfg.with_name("grub.cfg.new")
    tmp.write_text(cfg_text)
    os.replace(tmp, grub_cfg)
    out.err("done")
    if esps is None and esp_uuids(root) is not None:
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
        written_by="proxmox-boot-tool refresh" if esps else "update-grub",
        grub_default=chosen.version if chosen else None,
        grub_devid=rid,
        grub_on_esp=esps or [],
        menu=menu,
    )


# grub-common's scripts, which update_grub renders itself (or which print no entry here).
STOCK_SCRIPTS = ("00_header", "05_debian_theme", "10_linux", "20_linux_xen", "30_os-prober",
                 "30_uefi-firmware", "40_custom", "41_custom")  # fmt: skip
EXPORTED = ("GRUB_DEFAULT", "GRUB_TIMEOUT", "GRUB_DISTRIBUTOR", "GRUB_CMDLINE_LINUX",
            "GRUB_CMDLINE_LINUX_DEFAULT", "GRUB_DISABLE_RECOVERY", "GRUB_DEVICE")  # fmt: skip


def _scripts(root: Path, settings: dict[str, str]) -> tuple[str, str]:
    """The output of the other executable /etc/grub.d scripts: those named before 10_linux and
    those after, each in grub-mkconfig's BEGIN/END frame. A script that fails fails update-grub
    (grub-mkconfig runs them under set -e). Paths in a script are the twin's own: it runs with
    the twin as / (a directory root given by $TWIN_ROOT only in tests, which plant none)."""
    before, after = "", ""
    top = root / "etc/grub.d"
    for path in sorted(top.iterdir()) if top.is_dir() else []:
        name = path.name
        garbage = name.endswith("~") or (name.startswith("#") and name.endswith("#"))
        garbage = garbage or name.startswith("README")
        garbage = garbage or ".dpkg-" in name or name.endswith((".rpmsave", ".rpmnew", ".sig"))
        if name in STOCK_SCRIPTS or garbage or not path.is_file() or not os.access(path, os.X_OK):
            continue
        env = {**os.environ, **{k: settings.get(k) or "" for k in EXPORTED}}
        env["pkgdatadir"] = "/usr/share/grub"
        res = subprocess.run([str(path)], capture_output=True, text=True, env=env, check=False)
        if res.returncode != 0:
            raise RuntimeError(res.stderr.strip() or f"/etc/grub.d/{name} failed")
        text = f"\n### BEGIN /etc/grub.d/{name} ###\n{res.stdout}### END /etc/grub.d/{name} ###\n"
        if name < "10_linux":
            before += text
        else:
            after += text
    return before, after


def _esp_path(path: str) -> str:
    return path.removeprefix("/boot") if path.startswith("/boot/") else path


_MENUENTRY = re.compile(r"^menuentry '([^']*)'.*?(?:\$menuentry_id_option '([^']*)')?\s*\{$")


def menu_entries(text: str) -> dict[str, dict[str, str]]:
    """Top-level menu entries of a script's output: id (else title) -> title, linux path and
    options, initrd path (relative to GRUB's root: the device holding /boot/grub)."""
    found: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        m = _MENUENTRY.match(line)
        if m:
            current = {"title": m.group(1), "linux": "", "options": "", "initrd": ""}
            current["on_failure"] = ""  # "reboot": a `reboot` where loading its files fails
            found[m.group(2) or m.group(1)] = current
        elif current is not None and line.startswith("}"):
            current = None
        elif current is not None:
            # GRUB script: `if linux ...; then ...` runs the command between `if` and `;` (the
            # form gpuhost's trial entry uses to reboot when its files cannot be loaded)
            words = line.split(";", 1)[0].split()
            words = words[1:] if words[:1] == ["if"] else words
            if words[:1] == ["linux"] and len(words) > 1:
                current["linux"], current["options"] = words[1], " ".join(words[2:])
            elif words[:1] == ["initrd"] and len(words) > 1:
                current["initrd"] = words[1]
            elif words == ["reboot"]:
                current["on_failure"] = "reboot"
    return found


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
