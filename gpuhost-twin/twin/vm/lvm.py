"""The LVM root of the vm tier's bios-lvm image (a Proxmox VE ext4 install: /dev/pve/root, /boot
on it), made on a build machine whose kernel has no device-mapper (this CI's has none).

The real LVM tools write everything on disk: pvcreate and vgcreate need no kernel driver;
lvcreate refuses without the kernel's striped target, so the LV is added by vgcfgrestore from
the VG's own backup (LVM's text metadata format, as `vgcfgbackup` writes it) with a
logical_volumes section: one linear segment over every extent. The file system is then written
through a loop device over that segment's bytes (the PV's pe_start onwards), which is exactly
where device-mapper's linear target maps the LV when the image's own kernel activates it.
"""

from __future__ import annotations

import itertools
import re
import secrets
import string
from pathlib import Path

from twin.vm.imagefs import Build, ImageError

VG, LV = "pve", "root"  # as the Proxmox VE installer names them
ROOT_DEVICE = f"/dev/mapper/{VG}-{LV}"  # what update-grub writes as root= (10_linux: LVM)
_ID_CHARS = string.ascii_letters + string.digits


def lvm_id() -> str:
    """A new LVM UUID: 32 characters in LVM's 6-4-4-4-4-4-6 grouping."""
    raw = "".join(secrets.choice(_ID_CHARS) for _ in range(32))
    cuts = (0, 6, 10, 14, 18, 22, 26, 32)
    return "-".join(raw[a:b] for a, b in itertools.pairwise(cuts))


def root_lv(b: Build, pv: str) -> str:
    """Make pv a PV of VG `pve` holding LV `root` over all of it; returns a loop device of the
    LV's bytes (detached with the build). Every LVM command sees pv only (--devices: never the
    build machine's own disks or VGs) and keeps no backup or archive on the build machine."""
    lvm = ["--devices", pv, "--config", "backup { backup = 0 archive = 0 }"]
    b.run(["pvcreate", *lvm, "-ff", "-y", pv])
    b.run(["vgcreate", *lvm, VG, pv])
    backup = Path(b.log).with_name("vg-backup.txt")
    b.run(["vgcfgbackup", *lvm, "-f", backup, VG])
    text = backup.read_text()
    number = {k: int(_field(text, k)) for k in ("pe_start", "pe_count", "extent_size", "seqno")}
    backup.write_text(with_root_lv(text, number["pe_count"], number["seqno"]))
    b.run(["vgcfgrestore", *lvm, "-f", backup, VG])
    sector = 512  # pe_start and extent_size are in sectors in LVM's text format
    offset = number["pe_start"] * sector
    size = number["pe_count"] * number["extent_size"] * sector
    loop = b.run(["losetup", "--show", "-f", "--offset", str(offset), "--sizelimit", str(size), pv])
    b.undo.callback(b.run, ["losetup", "-d", loop.strip()])
    return loop.strip()


def _field(text: str, name: str) -> str:
    found = re.search(rf"^\s*{name} = (\d+)", text, re.M)
    if not found:
        raise ImageError(f"vgcfgbackup's output has no {name}")
    return found[1]


def with_root_lv(text: str, extents: int, seqno: int) -> str:
    """The VG backup ``text`` with LV `root` over extents 0..extents-1 of pv0, one seqno on."""
    section = (
        "\n\tlogical_volumes {\n\n"
        f"\t\t{LV} {{\n"
        f'\t\t\tid = "{lvm_id()}"\n'
        '\t\t\tstatus = ["READ", "WRITE", "VISIBLE"]\n'
        "\t\t\tflags = []\n"
        "\t\t\tsegment_count = 1\n\n"
        "\t\t\tsegment1 {\n"
        "\t\t\t\tstart_extent = 0\n"
        f"\t\t\t\textent_count = {extents}\n\n"
        '\t\t\t\ttype = "striped"\n'
        "\t\t\t\tstripe_count = 1\n\n"
        '\t\t\t\tstripes = [\n\t\t\t\t\t"pv0", 0\n\t\t\t\t]\n'
        "\t\t\t}\n\t\t}\n\t}\n"
    )
    end = text.rindex("\n}")  # the VG's closing brace
    text = text[:end] + "\n" + section + text[end:]
    return re.sub(r"^(\s*)seqno = \d+", rf"\g<1>seqno = {seqno + 1}", text, count=1, flags=re.M)
