"""What the firmware and bootloader boot: the kernel and its command line (stdlib plus twin).

Boot configuration snapshot: /var/lib/gpuhost-twin/bootcfg.json
----------------------------------------------------------------
A real bootloader boots what the last `proxmox-boot-tool refresh` / `update-grub` wrote, not what
/etc says now. The Proxmox tool shims record that snapshot whenever they run; its format:

    {
      "loader": "systemd-boot" | "grub",
      "cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet amd_iommu=on",
                 # the options of the boot entry: /etc/kernel/cmdline (systemd-boot), or for grub
                 # "root=<dev> ro $GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT"
      "kernel_default": "6.8.12-9-pve" | null,   # pinned/default entry; null = newest of "kernels"
      "kernel_next": "6.14.8-2-bpo12-pve" | null, # one-shot entry (kernel pin --next-boot)
      "kernels": ["6.8.12-9-pve", "6.14.8-2-bpo12-pve"],  # kernels with boot entries
      "entries": {"6.8.12-9-pve": "root=..."},   # optional: options per kernel entry
      "initrd": {"6.8.12-9-pve": {"files": {...}}},  # optional: initramfs synced to the ESP
      "written_by": "proxmox-boot-tool refresh", "written_at": 1764439200.0
    }

Boot consumes "kernel_next" (rewrites the file with null) and deletes /etc/kernel/next-boot-pin,
like the firmware's one-shot entry plus proxmox-boot-cleanup.service. Without the snapshot the
config files are read directly: /etc/kernel/{next-boot-pin,proxmox-boot-pin,cmdline} for
systemd-boot; /etc/default/grub + /etc/default/grub.d/*.cfg (GRUB_DEFAULT from
proxmox-kernel-pin.cfg) for GRUB; else the newest /boot/vmlinuz-*.

A kernel in the profile's failing_kernels "hangs": the twin power-cycles into the default entry
(recorded in hw.json "boot_attempts"); if that hangs too the host is bricked (BrickedError).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from twin import hwsim
from twin.profile import Profile

BOOTCFG = "var/lib/gpuhost-twin/bootcfg.json"


class BrickedError(RuntimeError):
    """Every kernel the bootloader would try hangs: the real host would not come back."""


def choose_kernel(hw: hwsim.Hw, profile: Profile) -> tuple[str, str, list[dict]]:
    installed = hw.installed_kernels()
    if not installed:
        raise BrickedError("no kernel image in /boot: the bootloader has nothing to boot")
    cfg = _bootcfg(hw, profile, installed)
    entries = [k for k in cfg["kernels"] if k in installed] or installed
    default = cfg["kernel_default"] if cfg["kernel_default"] in entries else entries[-1]
    first = cfg["kernel_next"] if cfg["kernel_next"] in entries else default
    _consume_next_boot(hw)
    attempts = []
    for kernel in dict.fromkeys([first, default]):
        if kernel in profile.failing_kernels:
            attempts.append({"kernel": kernel, "result": "hung at boot; power-cycled"})
            continue
        attempts.append({"kernel": kernel, "result": "booted"})
        options = cfg["entries"].get(kernel) or cfg["cmdline"]
        return kernel, _full_cmdline(profile, kernel, options), attempts
    raise BrickedError(
        f"kernel {first} hangs at boot and the default entry {default} does too: host bricked"
    )


def _bootcfg(hw: hwsim.Hw, profile: Profile, installed: list[str]) -> dict:
    path = hw.p(BOOTCFG)
    if path.exists():
        cfg = json.loads(path.read_text())
        return {
            "cmdline": cfg.get("cmdline", ""),
            "kernel_default": cfg.get("kernel_default"),
            "kernel_next": cfg.get("kernel_next"),
            "kernels": cfg.get("kernels") or installed,
            "entries": cfg.get("entries") or {},  # options per kernel, when the writer gives them
        }
    next_pin = _first_line(hw.p("etc/kernel/next-boot-pin"))
    pin = _first_line(hw.p("etc/kernel/proxmox-boot-pin"))
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
        "cmdline": cmdline,
        "kernel_default": pin,
        "kernel_next": next_pin,
        "kernels": installed,
        "entries": {},
    }


def _consume_next_boot(hw: hwsim.Hw) -> None:
    hw.p("etc/kernel/next-boot-pin").unlink(missing_ok=True)
    path = hw.p(BOOTCFG)
    if path.exists():
        cfg = json.loads(path.read_text())
        if cfg.get("kernel_next"):
            cfg["kernel_next"] = None
            hw.write(BOOTCFG, json.dumps(cfg, indent=1, sort_keys=True) + "\n")


def _full_cmdline(profile: Profile, kernel: str, options: str) -> str:
    """What the loader hands the kernel: systemd-boot adds initrd=, GRUB adds BOOT_IMAGE=."""
    if profile.boot.loader == "systemd-boot":
        head = f"initrd=\\EFI\\proxmox\\{kernel}\\initrd.img-{kernel}"
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
