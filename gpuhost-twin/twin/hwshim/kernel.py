"""uname and dmesg: what the simulated running kernel says about itself."""

from __future__ import annotations

import os
from pathlib import Path

from .common import err, hwsim, load_hw, out


def uname(argv: list[str]) -> int:
    hw = load_hw()
    if hw is None or not hw.kernel:
        real = (
            "/usr/bin/uname.distrib"
            if Path("/usr/bin/uname.distrib").exists()
            else "/bin/uname.distrib"
        )
        os.execv(real, ["uname", *argv])
    info = hw.kernel_info(hw.kernel)
    hostname = hw.p("etc/hostname")
    node = hostname.read_text().strip() if hostname.exists() else hw.profile["hostname"]
    parts = {
        "s": "Linux",
        "n": node,
        "r": hw.kernel,
        "v": info["build"],
        "m": "x86_64",
        "p": "unknown",
        "i": "unknown",
        "o": "GNU/Linux",
    }
    long = {
        "--kernel-name": "s",
        "--nodename": "n",
        "--kernel-release": "r",
        "--kernel-version": "v",
        "--machine": "m",
        "--processor": "p",
        "--hardware-platform": "i",
        "--operating-system": "o",
    }
    wanted: list[str] = []
    for a in argv:
        if a in ("-a", "--all"):
            wanted += ["s", "n", "r", "v", "m", "o"]  # GNU omits unknown -p/-i from -a
        elif a in long:
            wanted.append(long[a])
        elif a.startswith("-") and not a.startswith("--") and set(a[1:]) <= set(parts):
            wanted += list(a[1:])
        else:
            err(
                f"uname: invalid option -- '{a.lstrip('-')[:1]}'\nTry 'uname --help' for more information."
            )
            return 1
    order = "snrvmpio"
    picked = sorted(set(wanted or ["s"]), key=order.index)
    out(" ".join(parts[k] for k in picked) + "\n")
    return 0


def dmesg(argv: list[str]) -> int:
    """The simulated kernel's log (the real dmesg in a chroot would show the host's)."""
    hw = load_hw()
    log = hw.p(hwsim.DMESG) if hw else None
    if log is None or not log.exists():
        return 0
    text = log.read_text()
    if "-c" in argv or "--read-clear" in argv:
        log.write_text("")
    out(text)
    return 0
