"""journalctl -b -1 -k: the kernel log of the previous boot, which the simulated boot keeps
(a boot that panicked included); every other use goes to the real journalctl."""

from __future__ import annotations

import os

from .common import err, load_hw, out

REAL = "/bin/journalctl"


def journalctl(argv: list[str]) -> int:
    words = list(argv)
    previous = ("-b" in words and words[words.index("-b") + 1 :][:1] == ["-1"]) or "-b-1" in words
    if not (previous and ("-k" in words or "--dmesg" in words)):
        if not os.path.exists(REAL):
            err("journalctl: gpuhost twin simulates only -b -1 -k (the previous boot's kernel log)")
            return 1
        os.execv(REAL, ["journalctl", *argv])
    hw = load_hw()
    lines = list(hw.state.get("previous_boot_log") or []) if hw is not None else []
    if not lines:
        out("Specifying boot ID or boot offset has no effect, no persistent journal was found.\n")
        return 1
    limit = int(words[words.index("-n") + 1]) if "-n" in words[:-1] else len(lines)
    out("".join(f"{line}\n" for line in lines[-limit:]))
    return 0
