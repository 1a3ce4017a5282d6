#!/usr/bin/env python3
"""Write the Plan's managed files of some concerns on THIS machine, as the deploy would.

For machines the deploy cannot run on (the lent GPU machine: no systemd, no initramfs, no
reboot) so that the audit's file checks see a deployed host. Usage:
    tools/write-plan-files.py INVENTORY HOST CONCERN...   (CONCERN: modules, devices, cmdline)
"""

import os
import subprocess
import sys

from gpuhost.audit.observe import observe_host
from gpuhost.plan.make import make_plan
from gpuhost.spec.inventory import load_inventory


def run(command: str) -> tuple[int, str, str]:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


def main() -> None:
    inventory, name, *concerns = sys.argv[1:]
    spec = load_inventory(inventory)[name][0]
    plan = make_plan(name, spec, observe_host(run, sizes=(4096,)).facts)
    for f in plan.files.values():
        if f.concern not in concerns:
            continue
        if f.link is not None:
            os.makedirs(os.path.dirname(f.path), exist_ok=True)
            if os.path.lexists(f.path):
                os.remove(f.path)
            os.symlink(f.link, f.path)
        elif f.content is None:
            if os.path.lexists(f.path):
                os.remove(f.path)
        else:
            os.makedirs(os.path.dirname(f.path), exist_ok=True)
            with open(f.path, "w") as out:
                out.write(f.content)
            os.chmod(f.path, int(f.mode, 8))
        print(f"{f.concern}: {f.path}")


if __name__ == "__main__":
    main()
