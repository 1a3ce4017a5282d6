"""Twin speed figures: python -m twin.bench [--profile NAME]. Prints; asserts nothing.

Targets (issue 3): with the base cached, one twin up <= 5 s, eight twins up <= 15 s, one simulated
reboot <= 3 s. Uses twins 240..247 so a developer's twin1.. are left alone.
"""

from __future__ import annotations

import argparse
import time

from twin import lifecycle, node, rootfs
from twin.pytest_plugin import TwinHandle

FIRST = 240


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m twin.bench")
    parser.add_argument("--profile", default="kpro6", help="'bare' for no simulated hardware")
    args = parser.parse_args()
    profile = None if args.profile == "bare" else args.profile

    t0 = time.monotonic()
    base = rootfs.ensure_base()
    print(f"base cached:        {time.monotonic() - t0:6.2f} s  ({base.name})")
    names = [node.twin_name(i) for i in range(FIRST, FIRST + 8)]
    try:
        t0 = time.monotonic()
        (one,) = lifecycle.start_fleet(1, profile, FIRST)
        print(f"one twin up:        {time.monotonic() - t0:6.2f} s  (profile {args.profile})")
        handle = TwinHandle(one.address, twin=one)
        handle.run("true")
        print(f"one reboot:         {handle.reboot():6.2f} s  (reboot -> new boot_id, sshd up)")
        lifecycle.stop(one.name)
        t0 = time.monotonic()
        lifecycle.start_fleet(8, profile, FIRST)
        print(f"eight twins up:     {time.monotonic() - t0:6.2f} s")
        t0 = time.monotonic()
        for name in names:
            lifecycle.stop(name)
        print(f"eight twins down:   {time.monotonic() - t0:6.2f} s")
    finally:
        for name in names:
            lifecycle.stop(name)


if __name__ == "__main__":
    main()
