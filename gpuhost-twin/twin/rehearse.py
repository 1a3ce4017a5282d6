"""`gpuhost rehearse INVENTORY [--host H] [--facts DIR]`: the deploy, rehearsed on a twin made
from one read of the real host.

gpuhost-twin registers it as a gpuhost subcommand (entry-point group `gpuhost.commands`), like
`gpuhost twin`; `python -m twin.rehearse` runs it without that registration. Steps:

1. the inventory's host is chosen and everything refusable is refused (twin/rehearse_setup.py);
2. the host is read once over SSH, the probes the deploy reads (or --facts: a saved snapshot,
   no connection at all); nothing connects to the real host after this;
3. the converter (twin/fromcapture.py) makes a twin profile of the read, kept with the read and
   the rest of the rehearsal in <twin state root>/rehearsals/<host>-<time>/;
4. a developer twin starts from that profile, with the host's start state (its files, guests,
   driver as captured: twin/profile_start.py);
5. the deploy runs on the twin with the inventory's spec for the host, from an inventory that
   holds the twin alone (its address, its own API token, its guests' addresses, its CUDA
   mirror); it prints the plan the twin shows, what ran, each reboot and trial boot and how it
   ended, the audit's result, a second run's change count, and the wall time.

The twin is left running, so the user can look at it; the summary says how to stop it and how to
start it again from the kept profile.
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from twin.rehearse_setup import INDEX_ENV, RehearseError

DEPLOY = "deploys/gpu_host.py"


def add_command(sub: Any) -> argparse.ArgumentParser:
    """Add `rehearse` to gpuhost's subcommands (sub: argparse's subparsers action)."""
    rehearse = sub.add_parser(
        "rehearse",
        help="read a host once, then run its deploy on a twin made from that read (root)",
    )
    rehearse.add_argument("inventory")
    rehearse.add_argument("--host", help="the inventory's host (needed when it has several)")
    rehearse.add_argument(
        "--facts", metavar="DIR", help="a saved snapshot (gpuhost capture) instead of reading it"
    )
    rehearse.add_argument(
        "--index",
        type=int,
        help=f"the twin's index (default: ${INDEX_ENV}, else the highest free one below 200)",
    )
    rehearse.set_defaults(run=run)
    return rehearse


def run(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise RehearseError("twins need root (overlay mounts, chroot sshd): run with sudo")
    return Rehearsal(args.inventory, args.host, args.facts, args.index).run()


class Rehearsal:
    """One rehearsal: what it read, the twin it started, its report as it goes."""

    def __init__(self, inventory: str, host: str | None, facts: str | None, index: int | None):
        self.args = (inventory, host, facts, index)
        self.phases: list[tuple[str, float]] = []
        self.report: list[str] = []
        self._t = time.monotonic()

    def run(self) -> int:
        from twin import lifecycle
        from twin import rehearse_setup as setup
        from twin.errors import TwinError
        from twin.rootfs import RootfsError

        inventory, host, facts, index = self.args
        checkout = _checkout()
        # everything refusable first: no read, no twin for input that cannot be rehearsed
        target = setup.choose_host(inventory, host)
        raw = setup.read_saved(facts) if facts else None
        index = setup.pick_index(index)
        try:
            lifecycle.check_machine()
        except (TwinError, RootfsError) as exc:
            raise RehearseError(f"this machine cannot run a twin: {exc}") from None
        start = time.monotonic()
        self._t = start
        if raw is None:
            say(f"reading {target.name} once over SSH (the only connection to it)...")
            raw = setup.read_live(target)
            source = f"{target.name}, read over SSH at {_now()}"
        else:
            source = f"the snapshot {Path(facts or '').resolve()}"
        self.phase("read" if facts is None else "snapshot read")
        where = setup.rehearsal_dir(target.name)
        setup.keep_snapshot(where, raw)
        profile_path = where / "profile.yaml"
        profile = setup.make_profile(raw, target.name, source, profile_path)
        self.phase("profile")
        self.out(f"rehearsal of {target.name} from {source}")
        self.out(f"profile: {profile_path}")
        for line in profile.assumed:
            self.out(f"  assumed: {line}")
        try:
            twin = self.start_twin(index, profile_path)
        except (TwinError, RootfsError) as exc:
            raise RehearseError(f"the twin did not start: {exc}") from None
        spec = setup.twin_spec(target.spec, twin, setup.twin_containers(twin, target.spec))
        rehearsed = setup.write_inventory(where / "inventory.py", target.name, spec, twin)
        self.out(f"twin: {twin.name} at {twin.address}; inventory of the twin alone: {rehearsed}")
        self.show_start(twin, profile)
        self.show_plan(checkout, target.name, rehearsed, raw)
        deploy = self.pyinfra(checkout, rehearsed, where / "deploy-1.log", "deploy")
        audit = self.audit(checkout, rehearsed, where)
        again = self.pyinfra(checkout, rehearsed, where / "deploy-2.log", "second run")
        total = time.monotonic() - start
        self.section("reboots and trial boots")
        from twin.rehearse_report import render_boots

        self.out(*render_boots([deploy, again]))
        converged = again.rc == 0 and again.changes == 0
        self.section("second run")
        if again.rc != 0:
            self.out(f"failed (exit {again.rc}; its errors are above): not converged")
        else:
            self.out(f"{again.changes} changes" + (" (converged)" if converged else ""))
        self.section("figures")
        self.out(*(f"{name}: {seconds:.1f} s" for name, seconds in self.phases))
        if converged:
            self.out(f"capture to converged twin: {total:.1f} s")
        else:
            self.out(f"capture to the second run's end: {total:.1f} s (not converged)")
        self.section("kept")
        self.out(
            f"{where}: profile.yaml, snapshot/ (the host's read, no secrets), twin-snapshot/ (the twin's, "
            "before the deploy), inventory.py, deploy and audit logs, audit.json, report.txt",
            f"the twin runs on: stop it with  python -m twin stop {twin.name}",
            f"start it again:  python -m twin start --first {twin.index} --profile {profile_path}",
            f"then:            pyinfra {rehearsed} {DEPLOY}",
            f"rehearse again from the same read:  gpuhost rehearse {inventory} "
            f"--host {target.name} --facts {where / 'snapshot'}",
        )
        (where / "report.txt").write_text("\n".join(self.report) + "\n")
        return 0 if deploy.rc == 0 and converged and audit.rc == 0 else 1

    # ------------------------------------------------------------ steps

    def start_twin(self, index: int, profile_path: Path) -> Any:
        from twin import lifecycle

        say(f"starting twin{index} from {profile_path}...")
        (twin,) = lifecycle.start_fleet(1, str(profile_path), first=index)
        self.phase("twin start")
        return twin

    def show_start(self, twin: Any, profile: Any) -> None:
        """The host as read, which the twin was given before its first boot (twin/startstate.py),
        and what that first boot did with it."""
        from twin import startstate

        self.section("the twin's start state (the host as read)")
        start = profile.start
        if start is None:
            self.out("none: the profile has no start section (a factory install)")
            return
        driver = start.driver
        guests = [f"{g.kind} {g.vmid}{' (running)' if g.running else ''}" for g in start.guests]
        if start.packages is None:
            packages = "not captured (the twin's own)"
        else:  # {}: the host had no Proxmox VE
            packages = ", ".join(f"{name} {v}" for name, v in start.packages.items()) or "none"
        self.out(
            f"kernel {start.running_kernel or 'not captured'}; driver "
            + (
                f"{driver.version} ({'open' if driver.open else 'proprietary'})"
                if driver
                else "none"
            ),
            f"guests: {', '.join(guests) or 'none'}; Proxmox packages: {packages}",
            f"{len(start.files)} files and {len(start.links)} links as read",
            *startstate.report(twin.root),
        )

    def show_plan(self, checkout: Path, host: str, rehearsed: Path, raw: dict) -> None:
        """The plan the twin shows (the deploy's own), and whether the capture gives the same.

        The twin is read by `gpuhost capture` in a process of its own, kept beside the host's
        read (twin-snapshot/): pyinfra keeps the first known_hosts it loads for its process, from
        before this twin's key was written (sshuserclient's memoized get_host_keys)."""
        from gpuhost.observe.hostfacts import read_snapshot
        from twin import rehearse_setup as setup

        target = setup.choose_host(str(rehearsed), host)
        where = rehearsed.parent / "twin-snapshot"
        command = [sys.executable, "-m", "gpuhost.cli", "capture", str(rehearsed), "--out"]
        done = subprocess.run([*command, str(where)], cwd=checkout, capture_output=True, text=True)
        if done.returncode != 0:
            raise RehearseError(f"reading the twin failed: {done.stderr.strip()[-400:]}")
        twin_raw = read_snapshot(where)
        shown = _plan_text(target, twin_raw)
        self.phase("plan")
        self.section("plan (from the twin's facts)")
        self.out(shown)
        captured = _plan_text(target, raw)
        if captured == shown:
            self.out("(the plan from the capture itself is the same)")
            return
        diff = difflib.unified_diff(
            captured.splitlines(), shown.splitlines(), "from the capture", "from the twin", n=0
        )
        self.out("the plan from the capture differs from the twin's:", *list(diff)[2:])

    def pyinfra(self, checkout: Path, rehearsed: Path, log: Path, what: str) -> Any:
        from twin.rehearse_report import render_run, summarise

        pyinfra = Path(sys.executable).parent / "pyinfra"
        command = [str(pyinfra), "-y", str(rehearsed), DEPLOY]
        say(f"{what}: {' '.join(command)} (log: {log})")
        done = subprocess.run(command, cwd=checkout, capture_output=True, text=True)
        log.write_text(done.stdout + done.stderr)
        summary = summarise(done.returncode, done.stdout + done.stderr)
        self.phase(what)
        self.section(f"{what}: what ran")
        self.out(*render_run(summary, log))
        return summary

    def audit(self, checkout: Path, rehearsed: Path, where: Path) -> Any:
        from twin.rehearse_report import render_audit, summarise_audit

        report = where / "audit.json"
        command = [sys.executable, "-m", "gpuhost.cli", "audit", str(rehearsed)]
        say(f"audit: {' '.join(command)}")
        done = subprocess.run(
            [*command, "--json", str(report)], cwd=checkout, capture_output=True, text=True
        )
        (where / "audit.log").write_text(done.stdout + done.stderr)
        summary = summarise_audit(done.returncode, report)
        self.phase("audit")
        self.section("audit")
        self.out(*render_audit(summary, report))
        return summary

    # ------------------------------------------------------------ output

    def phase(self, name: str) -> None:
        now = time.monotonic()
        self.phases.append((name, now - self._t))
        self._t = now

    def section(self, title: str) -> None:
        self.out("", f"== {title}")

    def out(self, *lines: str) -> None:
        for line in lines:
            print(line, flush=True)
            self.report.append(line)


def _plan_text(target: Any, raw: dict) -> str:
    from gpuhost.control import read_control
    from gpuhost.observe.hostfacts import parse_raw
    from gpuhost.plan.make import make_plan
    from gpuhost.plan.render import render_plan

    facts = parse_raw(raw)
    source = str(target.inventory)
    control = read_control(target.spec, facts, source)
    return render_plan(make_plan(target.name, target.spec, facts, source, control))


def _checkout() -> Path:
    """The gpuhost checkout whose deploys run (pyinfra runs from it, as `gpuhost twin` does)."""
    import gpuhost

    root = Path(gpuhost.__file__).resolve().parents[1]
    if not (root / DEPLOY).is_file():
        raise RehearseError(f"{root} has no {DEPLOY}: run gpuhost from a gpuhost checkout")
    return root


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m twin.rehearse ...`: the command without gpuhost's entry-point registration."""
    parser = argparse.ArgumentParser(prog="gpuhost")
    add_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["rehearse", *(sys.argv[1:] if argv is None else argv)])
    from pyinfra.api.exceptions import PyinfraError

    try:
        return args.run(args)
    except (
        ValueError,
        PyinfraError,
    ) as exc:  # RehearseError, a bad inventory: one line, as gpuhost's main
        print(f"gpuhost: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
