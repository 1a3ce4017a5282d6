"""bootctl (systemd 252) as far as a trial boot uses it: set-oneshot, set-default, status.

Like the real one: the EFI variable verbs need a UEFI boot and LoaderInfo (a Boot Loader
Interface loader started this boot), never look for the ESP and never check that the ID exists;
"" deletes the variable. Firmware that drops writes (quirk efivars_readonly) still answers rc 0.
"""

from __future__ import annotations

from pathlib import Path

from .common import err, hwsim, root

efivars = hwsim.efivars

VERBS = {"set-oneshot": "LoaderEntryOneShot", "set-default": "LoaderEntryDefault"}
NO_ESP = (
    "Couldn't find EFI system partition. It is recommended to mount it to /boot or /efi.\n"
    "Alternatively, use --esp-path= to specify path to mount point."
)


def out(line: str) -> None:
    print(line)


def bootctl(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    verb = args[0] if args else "status"
    machine = root()
    if verb in VERBS:
        if len(args) != 2:
            err(f"'{verb}' requires exactly one argument.")  # argument count check
            return 1
        if not efivars.uefi(machine):
            err("Not booted with UEFI.")
            return 1
        if efivars.read_string(machine, "LoaderInfo") is None:
            err("Not booted with a supported boot loader.")
            return 1
        efivars.write_string(machine, VERBS[verb], _resolve(machine, args[1]))
        return 0
    if verb == "status":
        return _status(machine)
    err(f"Unknown command verb {verb}.")
    return 1


def _resolve(machine: Path, value: str) -> str:
    names = {"@current": "LoaderEntrySelected", "@default": "LoaderEntryDefault",
             "@oneshot": "LoaderEntryOneShot"}  # fmt: skip
    if value in names:
        return efivars.read_string(machine, names[value]) or ""
    return value


def _status(machine: Path) -> int:
    uefi = efivars.uefi(machine)
    err(NO_ESP)  # the ESPs of a Proxmox host are not mounted
    out("System:")
    if uefi:
        fw = efivars.read_string(machine, "LoaderFirmwareType") or "n/a"
        info = efivars.read_string(machine, "LoaderFirmwareInfo")
        out(f"     Firmware: {fw}" + (f" ({info})" if info else ""))
        out("  Secure Boot: disabled (user)")
        out(" TPM2 Support: no")
        out(" Boot into FW: supported")
    else:
        out("Not booted with EFI")
    out("")
    product = efivars.read_string(machine, "LoaderInfo") if uefi else None
    if product:
        out("Current Boot Loader:")
        out(f"      Product: {product}")
        out("     Features: ✓ Boot counting")
        for feature in ("Menu timeout control", "One-shot menu timeout control",
                        "Default entry control", "One-shot entry control",
                        "Support for XBOOTLDR partition", "Support for passing random seed to OS",
                        "Load drop-in drivers", "Boot loader sets ESP information"):  # fmt: skip
            out(f"               ✓ {feature}")
        part = efivars.read_string(machine, "LoaderDevicePartUUID")
        out(
            f"          ESP: /dev/disk/by-partuuid/{part.lower()}" if part else "          ESP: n/a"
        )
        out("         File: └─/EFI/systemd/systemd-bootx64.efi")
        out("")
    return 0


__all__ = ["bootctl", "hwsim"]
