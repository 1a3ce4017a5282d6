"""Hardware-facing tools of the twin, stdlib only; one entry per tool: main(tool, argv) -> exit code.

Installed as the package /usr/lib/gpuhost-twin/hwshim next to the hwsim package; each tool is a
three-line wrapper (see hardware.py). $TWIN_ROOT (default "/") is the machine's root.

One module per tool family: nvidia_smi (+ smi_text), lspci, kmod (lsmod, modprobe, modinfo,
depmod), nvidia_modprobe, kernel (uname, dmesg), bootctl (EFI variables), esp_mount (the ESPs), fabric (the NVSwitch fabric), storage (zpool, pvesm);
common holds what they share.
"""

from __future__ import annotations

from .bootctl import bootctl
from .common import hwsim, root
from .esp_mount import mount, umount
from .fabric import fabric
from .findmnt import findmnt
from .journal import journalctl
from .kernel import dmesg, uname
from .kmod import depmod, lsmod, modinfo, modprobe
from .lspci import lspci
from .nvidia_modprobe import nvidia_modprobe
from .nvidia_smi import nvidia_smi
from .storage import pvesm, zpool

TOOLS = {
    "nvidia-smi": nvidia_smi,
    "dmesg": dmesg,
    "lspci": lspci,
    "lsmod": lsmod,
    "modprobe": modprobe,
    "modinfo": modinfo,
    "depmod": depmod,
    "nvidia-modprobe": nvidia_modprobe,
    "uname": uname,
    "bootctl": bootctl,
    "mount": mount,
    "umount": umount,
    "journalctl": journalctl,
    "findmnt": findmnt,
    "gpuhost-twin-fabric": fabric,
    "zpool": zpool,
    "pvesm": pvesm,
}


MUTATING = ("modprobe", "nvidia-modprobe", "gpuhost-twin-fabric")


def main(tool: str, argv: list[str]) -> int:
    if tool == "modprobe":
        with hwsim.locked(root()) as lock:
            return modprobe(argv, lock)
    if tool in MUTATING:
        with hwsim.locked(root()):
            return TOOLS[tool](argv)
    return TOOLS[tool](argv)
