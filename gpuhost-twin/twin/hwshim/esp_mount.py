"""mount/umount for the twin's ESPs: `mount -t vfat /dev/disk/by-uuid/<UUID> DIR` of an ESP the
machine has (/var/lib/gpuhost-twin/esp/<UUID>, what that vfat holds) shows its files at DIR;
`umount DIR` takes them away and leaves the empty mount point, as the real ones do. Anything
else goes to the real /bin/mount and /bin/umount."""

from __future__ import annotations

import os
from pathlib import Path

from .common import err, root

ESP_DIR = "var/lib/gpuhost-twin/esp"
BY_UUID = "/dev/disk/by-uuid/"
REAL = {"mount": "/bin/mount", "umount": "/bin/umount"}


def _real(tool: str, argv: list[str]) -> int:
    os.execv(REAL[tool], [tool, *argv])
    return 1  # not reached


def _esp(machine: Path, device: str) -> Path | None:
    if not device.startswith(BY_UUID):
        return None
    esp = machine / ESP_DIR / device.removeprefix(BY_UUID)
    return esp if esp.is_dir() else None


def mount(argv: list[str]) -> int:
    machine = root()
    words = [a for a in argv if not a.startswith("-")]
    fstype = argv[argv.index("-t") + 1] if "-t" in argv[:-1] else None
    words = [w for w in words if w != fstype]
    if len(words) != 2 or _esp(machine, words[0]) is None:
        return _real("mount", argv)
    esp, target = _esp(machine, words[0]), Path(words[1])
    if fstype not in (None, "vfat"):
        err(f"mount: {target}: wrong fs type, bad option, bad superblock on {words[0]}.")
        return 32
    if not target.is_dir() or target.is_symlink():
        err(f"mount: {target}: mount point does not exist.")
        return 32
    if any(target.iterdir()):
        err(f"mount: {target}: twin: mount point is not empty")
        return 32
    target.rmdir()
    target.symlink_to(Path("/") / ESP_DIR / esp.name)
    return 0


def umount(argv: list[str]) -> int:
    words = [a for a in argv if not a.startswith("-")]
    if len(words) == 1:
        target = Path(words[0])
        if target.is_symlink() and os.readlink(target).startswith(f"/{ESP_DIR}/"):
            target.unlink()
            target.mkdir()
            return 0
    return _real("umount", argv)
