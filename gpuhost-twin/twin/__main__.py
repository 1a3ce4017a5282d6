"""python -m twin start|stop|list|shell|ssh-config: run simulated Proxmox GPU hosts (twins).

python -m twin start -n 2 --profile kpro6     twin1, twin2 on 127.0.0.2, 127.0.0.3
python -m twin list
python -m twin shell twin1                    an interactive root shell over SSH
python -m twin ssh-config                     how to point ssh/pyinfra/testinfra at them
python -m twin upgrade twin1 --to kpro6-pve9   PVE 8 -> 9 in place, then reboot
python -m twin stop --all                     (or: stop twin1) no mounts or processes remain
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from twin import lifecycle, node, processes
from twin.errors import TwinError
from twin.rootfs import RootfsError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m twin", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_start = sub.add_parser("start", help="start N twins (twin1..twinN) concurrently")
    p_start.add_argument("-n", type=int, default=1, help="how many twins (default 1)")
    p_start.add_argument("--first", type=int, default=1, help="index of the first twin (default 1)")
    p_start.add_argument(
        "--profile", default=None, help="hardware profile name or YAML path (default: a bare host)"
    )
    p_stop = sub.add_parser("stop", help="stop and remove twins")
    p_stop.add_argument("names", nargs="*")
    p_stop.add_argument("--all", action="store_true")
    sub.add_parser("list", help="list twins and their guests")
    p_shell = sub.add_parser("shell", help="open a root shell on a twin (or one of its guests)")
    p_shell.add_argument("name")
    p_shell.add_argument("--ct", type=int, help="a guest's CT id instead of the twin itself")
    p_shell.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("ssh-config", help="print the SSH settings for the twins")
    p_up = sub.add_parser(
        "upgrade", help="upgrade a PVE 8 twin in place to PVE 9 (twin/upgrade.py)"
    )
    p_up.add_argument("name")
    p_up.add_argument("--to", required=True, help="the PVE 9 profile of the same machine")
    args = parser.parse_args(argv)

    if os.geteuid() != 0 and args.cmd in ("start", "stop", "shell", "upgrade"):
        parser.error("twins need root (mounts, chroot sshd, LXC)")
    try:
        return _run(parser, args)
    except (TwinError, RootfsError) as exc:
        print(f"python -m twin {args.cmd}: {exc}", file=sys.stderr)
        return 1


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.cmd == "start":
        t0 = time.monotonic()
        twins = lifecycle.start_fleet(args.n, args.profile, args.first)
        for t in twins:
            print(f"{t.name}\t{t.address}\t{t.profile or 'bare'}")
            if (t.dir / "boot-error").exists():
                print(
                    f"{t.name}: simulated boot failed, see {t.dir / 'boot-error'}", file=sys.stderr
                )
        print(f"{len(twins)} twin(s) up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        print(f"connect: ssh -F {node.ssh_config()} root@{twins[0].address}", file=sys.stderr)
    elif args.cmd == "stop":
        if args.all:
            stopped = lifecycle.stop_all()
            print(f"stopped {', '.join(stopped)}" if stopped else "no twins running")
        elif not args.names:
            parser.error("name twins to stop, or --all")
        for name in args.names:
            print(f"stopped {name}" if lifecycle.stop(name) else f"{name}: no such twin")
    elif args.cmd == "upgrade":
        from twin.upgrade import upgrade

        twin = upgrade(args.name, args.to)
        print(f"{twin.name}\t{twin.address}\t{twin.profile}\tupgraded")
    elif args.cmd == "list":
        twins = node.list_twins()
        if not twins:
            print("no twins running (start one: python -m twin start --profile kpro6)")
        problem = processes.port_22_problem() if twins else None
        for t in twins:
            up = node.state(t)
            broken = " BOOT-ERROR" if (t.dir / "boot-error").exists() else ""
            print(f"{t.name}\t{t.address}\t{t.profile or 'bare'}\t{up}{broken}")
            for state in sorted((t.root / "run/gpuhost-twin/ct").glob("*.json")):
                print(f"  CT {state.stem}\t{t.guest_address(int(state.stem))}\trunning")
        if problem:
            print(f"warning: {problem}")
    elif args.cmd == "shell":
        twin = node.Twin.load(args.name)
        address = twin.address if args.ct is None else twin.guest_address(args.ct)
        ssh = ["ssh", "-F", str(node.ssh_config()), f"root@{address}", *args.command]
        os.execvp("ssh", ssh)
    elif args.cmd == "ssh-config":
        print("user:        root")
        print(f"key:         {node.client_key()}")
        print(f"known_hosts: {node.known_hosts()}")
        print(f"ssh config:  {node.ssh_config()}")
        for t in node.list_twins():
            print(f"host:        {t.name} {t.address}:22")
            if (t.dir / "api-token").exists():
                print(
                    f"  Proxmox API https://{t.address}:8006/api2/json, token in {t.dir / 'api-token'},"
                )
                print(f"  CA {t.root / 'etc/pve/local/pve-ssl.pem'}")
        print(f"\n# OpenSSH:   ssh -F {node.ssh_config()} root@<address>")
        print(f"# testinfra: pytest --hosts=ssh://root@<address> --ssh-config={node.ssh_config()}")
        print(
            f"# pyinfra:   ssh_key={node.client_key()!s}, ssh_known_hosts_file={node.known_hosts()!s},"
            " ssh_strict_host_key_checking='yes'"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
