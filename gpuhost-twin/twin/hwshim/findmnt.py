"""findmnt -T PATH: the file system a path lives on, as the profile's install laid the disks out
(docs/reference/trial-boot.md §0; hwsim/storage.py): ZFS (rpool/ROOT/pve-1) on ESP hosts, LVM (pve/root) for a
plain GRUB install with /boot on the root, a plain partition otherwise. The twin's own overlay
mount is not what a real host would show, so the real findmnt is not asked."""

from __future__ import annotations

from .common import err, hwsim, load_hw, out


def findmnt(argv: list[str]) -> int:
    hw = load_hw()
    if hw is None:
        err("findmnt: gpuhost twin: no machine state")
        return 1
    columns = ["TARGET", "SOURCE", "FSTYPE", "OPTIONS"]
    if "-o" in argv[:-1]:
        columns = argv[argv.index("-o") + 1].upper().split(",")
    source, fstype = hwsim.storage.root_fs(hw.profile.get("boot", {}))
    row = {"TARGET": "/", "SOURCE": source, "FSTYPE": fstype, "OPTIONS": "rw,relatime"}
    unknown = [c for c in columns if c not in row]
    if unknown:
        err(f"findmnt: unknown column: {unknown[0]}")
        return 1
    widths = [max(len(c), len(row[c])) for c in columns]
    lines = [] if "-n" in argv or "--noheadings" in argv else [columns]
    lines.append([row[c] for c in columns])
    for line in lines:
        out(" ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() + "\n")
    return 0
