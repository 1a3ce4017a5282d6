"""The per-twin supervisor: boots the twin, keeps /proc/uptime true, serves in-twin requests.

Run detached by `twin.lifecycle.start` as `python -m twin.supervisor <twin dir>`; it lives outside
the chroot. Its sshd is its child; SIGTERM stops guests, sessions and sshd, then the supervisor.

Request protocol (shims inside the twin use /usr/lib/gpuhost-twin/twinreq.py):
    a shim writes  <root>/run/gpuhost-twin/requests/<id>.json   (atomically: tmp file + rename)
    we answer in   <root>/run/gpuhost-twin/requests/<id>.done   {"rc": int, "stdout": str, "stderr": str}
Ops (see twin/README.md): reboot, ct-start, ct-stop, ct-exec, ct-push. Requests run one at a time, in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from twin import guests, mounts, node, processes, procview, units
from twin.errors import TwinError
from twin.pve import guest_state

SSHD = shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin") or "/usr/sbin/sshd"
RUN = "run/gpuhost-twin"
API_PORT = 8006


class Supervisor:
    def __init__(self, tdir: Path) -> None:
        self.twin = node.Twin.load(tdir.name)
        self.root = self.twin.root
        self.requests = self.root / RUN / "requests"
        self.profile: Any = node.load_profile(self.twin.profile) if self.twin.profile else None
        self.sshd: subprocess.Popen[bytes] | None = None
        self.api: Any = None  # the Proxmox API server (https, port 8006) of a profiled twin
        self.booted = time.monotonic()
        self.uptime_offset = 0.0
        self.lock = threading.Lock()  # uptime writes vs. a boot resetting the clock
        self.stopping = threading.Event()
        self.work: queue.Queue[Path] = queue.Queue()
        self.seen: set[str] = set()

    # -- boot ---------------------------------------------------------------------------------
    def boot(self) -> None:
        """One (re)boot: fresh /run state, simulated hardware state, new boot_id, sshd up."""
        with self.lock:
            boot_id = self.root / "proc/sys/kernel/random/boot_id"
            old_id = boot_id.read_text() if boot_id.exists() else ""
            mounts.mount_volatile(self.root)
            guest_state.forget_kernel_view(self.root)
            self.requests.mkdir(parents=True)
            self.seen.clear()
            uptime = self.root / "proc/uptime"
            uptime.unlink(missing_ok=True)
            bricked = False
            (self.twin.dir / "boot-error").unlink(missing_ok=True)
            if self.profile is not None:
                from twin import boot

                try:
                    boot.simulate_boot(self.root, self.profile, live_sysfs=True)
                except boot.BrickedError as exc:
                    # A simulated failure: like the real host, the twin does not come back.
                    bricked = True
                    (self.twin.dir / "boot-error").write_text(f"bricked: {exc}\n")
                    log(f"bricked: {exc}")
                except Exception:
                    # A bug in the simulation, not a simulated failure: keep the twin reachable
                    # and say so loudly.
                    err = traceback.format_exc()
                    (self.twin.dir / "boot-error").write_text(err)
                    log(f"simulate_boot failed:\n{err}")
            # The simulation may start the clock a few seconds in (firmware and kernel time).
            self.uptime_offset = float(uptime.read_text().split()[0]) if uptime.exists() else 0.0
            if not boot_id.exists() or boot_id.read_text() == old_id:  # the simulation may set it
                boot_id.parent.mkdir(parents=True, exist_ok=True)
                boot_id.write_text(f"{uuid.uuid4()}\n")
            self.booted = time.monotonic()
            self.write_uptime()
        if bricked:
            return
        # systemd's part of the boot: enabled oneshot units, after the modules, before guests.
        try:
            for unit, rc in units.run_boot_units(self.root).items():
                log(f"boot unit {unit}: exit status {rc}")
        except Exception:
            log(f"boot units failed:\n{traceback.format_exc()}")
        # a twin made from a capture: the modules the host had loaded, at its first boot
        if self.profile is not None and self.profile.start is not None:
            from twin import startstate

            startstate.first_boot_modules(self.root)
        # what the units wrote to sysfs control files took effect at once on a real kernel
        self.apply_sysfs_writes()
        if self.profile is not None:
            from twin.pve import api

            # pveproxy: https on the twin's address, API tokens from /etc/pve/priv/token.cfg.
            # Up before sshd, so a twin that answers SSH answers the API too.
            self.api, _ = api.serve_in_thread(self.root, self.twin.address, API_PORT)
        self.start_sshd()
        self.start_guests()
        if self.profile is not None and self.profile.start is not None:
            from twin import startstate

            startstate.first_boot_guests(self.twin)  # those that ran, once

    def start_guests(self) -> None:
        """pve-guests.service (pve-manager services/pve-guests.service): the ExecStartPre lines
        its drop-ins add, then startall of the onboot guests. (Its own ExecStartPre,
        pve-startall-delay, only sleeps the datacenter's startall delay: left out.) A pre-step
        still running after 2 s keeps the guests waiting, as systemd keeps the unit
        activating (TimeoutSec=infinity): a thread waits for it and queues the start as a
        request, so it runs between other requests. A reboot kills the pre-step (it runs in the
        twin) and with it that start; a failed pre-step fails the unit: no guest starts."""
        self._pve_guests_activating(True)
        pre = units.drop_in_exec_start_pre(self.root, "pve-guests.service")
        if not pre:
            self._start_onboot()
            return
        script = "\n".join(
            f"{{ {line.lstrip('-@+!:')}\n}} || :"
            if line.startswith("-")
            else f"{line.lstrip('@+!:')} || exit $?"
            for line in pre
        )
        with open(self.twin.dir / "pve-guests.log", "ab") as out:
            proc = subprocess.Popen(
                ["chroot", str(self.root), "/bin/sh", "-c", script],
                env=units.ENV,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        try:
            rc = proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            boot = self.root / "proc/sys/kernel/random/boot_id"
            threading.Thread(
                target=self._start_guests_after, args=(proc, boot.read_text()), daemon=True
            ).start()
            log("pve-guests: waiting for its ExecStartPre")
            return
        if rc == 0:
            self._start_onboot()
        else:
            self._pve_guests_activating(False)
            log(f"pve-guests: ExecStartPre failed ({rc}): no guest started")

    def _start_onboot(self) -> None:
        try:
            guests.start_onboot(self.twin)
        finally:
            self._pve_guests_activating(False)

    def _pve_guests_activating(self, on: bool) -> None:
        """pve-guests.service is Type=oneshot with RemainAfterExit=yes (pve-manager
        services/pve-guests.service): systemd shows it "activating" from its ExecStartPre steps
        until its ExecStart, the startall of the onboot guests, has returned; the twin's
        systemctl reads this mark (shims/systemctl active_state). /run goes with the boot."""
        mark = self.root / RUN / "systemd" / "pve-guests.service.activating"
        if on:
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.touch()
        else:
            mark.unlink(missing_ok=True)

    def _start_guests_after(self, proc: subprocess.Popen[bytes], boot_id: str) -> None:
        rc = proc.wait()
        boot = self.root / "proc/sys/kernel/random/boot_id"
        if rc != 0 or self.stopping.is_set() or not boot.exists() or boot.read_text() != boot_id:
            if boot.exists() and boot.read_text() == boot_id:
                self._pve_guests_activating(False)
            log(f"pve-guests: ExecStartPre ended ({rc}); no guest started by it")
            return
        request = self.requests / f"pve-guests-{uuid.uuid4()}.json"
        tmp = request.with_name(f".{request.name}.tmp")
        tmp.write_text(json.dumps({"op": "onboot"}))
        tmp.rename(request)

    def start_sshd(self) -> None:
        cfg = self.twin.dir / "ssh" / "sshd_config"
        # Its own UTS namespace, so `hostname`/`uname -n` in a session name the twin, not us.
        cmd = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.twin.name]
        with open(self.twin.dir / "sshd.log", "ab") as sshd_log:
            self.sshd = subprocess.Popen(
                [*cmd, SSHD, "-D", "-e", "-f", str(cfg)],
                stdin=subprocess.DEVNULL,
                stderr=sshd_log,
            )
        if not processes.wait_port(self.twin.address, 22):
            raise TwinError(f"sshd of {self.twin.name} does not answer on {self.twin.address}")

    def halt(self) -> None:
        """What a power cycle takes away: guests, every session and sshd."""
        guests.stop_all(self.twin.dir)
        if self.api is not None:
            self.api.shutdown()
            self.api.server_close()
            self.api = None
        if self.sshd is not None:
            # sshd's per-connection monitors run outside the chroot in sessions of their own:
            # kill them too, or an open SSH session would survive the "power cycle".
            for pid in processes.descendants(self.sshd.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.sshd.kill()
        processes.kill_processes(self.twin.dir)
        if self.sshd is not None:
            self.sshd.wait()
            self.sshd = None

    def reboot(self) -> None:
        t0 = time.monotonic()
        self.halt()
        self.boot()
        log(f"rebooted in {time.monotonic() - t0:.2f} s")

    def apply_sysfs_writes(self, retry: bool = False) -> None:
        """What the kernel does at once when a sysfs control file is written (bind, unbind,
        drivers_probe): the supervisor holds the control FIFOs open and applies each request
        (hwsim/sysfs_ctl.py); ``retry`` also retries unbinds the nvidia driver waits on."""
        if self.profile is None:
            return
        from twin import hwsim
        from twin.hwsim import sysfs_ctl

        try:
            found = sysfs_ctl.hold_all(self.root)
            if sysfs_ctl.pending(self.root, found) or (retry and _removals_waiting(self.root)):
                hwsim.apply_sysfs_writes(self.root)
        except Exception:
            log(f"sysfs writes failed:\n{traceback.format_exc()}")

    def write_uptime(self) -> None:
        up = self.uptime_offset + time.monotonic() - self.booted
        path = self.root / "proc/uptime"
        tmp = path.with_name(".uptime.tmp")
        tmp.write_text(f"{up:.2f} {up * (os.cpu_count() or 1) * 0.97:.2f}\n")
        tmp.rename(path)  # readers never see a half-written file

    # -- requests -----------------------------------------------------------------------------
    def handle(self, req: dict[str, Any]) -> dict[str, Any] | None:
        op = req.get("op")
        if op == "reboot":
            self.reboot()
            return None  # the requester's session is gone; nobody reads an answer
        if op == "onboot":  # pve-guests' startall, after its ExecStartPre let it go on
            self._start_onboot()
            return None
        if op in ("ct-start", "ct-stop", "ct-status", "ct-exec", "ct-push", "ct-hotplug-dev"):
            try:
                ctid = int(req["ctid"])
            except (KeyError, TypeError, ValueError):
                return answer(2, stderr=f"{op}: 'ctid' must be an integer\n")
            if op == "ct-start":
                return guests.start(self.twin, ctid)
            if op == "ct-stop":
                return guests.stop(self.twin, ctid)
            if op == "ct-status":
                return guests.status(self.twin, ctid)
            if op == "ct-hotplug-dev":
                return guests.hotplug_device(self.twin, ctid, str(req.get("value")))
            if op == "ct-push":
                return guests.push(
                    self.twin, ctid, str(req.get("file")), str(req.get("dest")), req.get("perms")
                )
            argv = req.get("argv")
            if not isinstance(argv, list) or not argv:
                return answer(2, stderr="ct-exec: 'argv' must be a non-empty list\n")
            return guests.exec_(self.twin, ctid, [str(a) for a in argv], req.get("stdin"))
        return answer(2, stderr=f"unknown twin request op {op!r}\n")

    def worker(self) -> None:
        while not self.stopping.is_set():
            try:
                path = self.work.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                text = path.read_text()
                path.unlink()
            except FileNotFoundError:
                continue  # cleared by a reboot before we got to it
            try:
                result = self.handle(json.loads(text))
            except Exception:
                result = answer(1, stderr=f"twin supervisor error:\n{traceback.format_exc()}")
            if result is not None and self.requests.is_dir():
                done = path.with_suffix(".done")
                tmp = path.with_name(f".{path.stem}.done.tmp")
                tmp.write_text(json.dumps(result))
                tmp.rename(done)

    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        self.boot()
        (self.twin.dir / "ready").write_text(f"{os.getpid()}\n")
        worker = threading.Thread(target=self.worker, daemon=True)
        worker.start()
        last = last_pids = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            if now - last >= 1.0:
                with self.lock:
                    self.write_uptime()
                last = now
            retry = now - last_pids >= 0.5
            if retry:
                with contextlib.suppress(OSError):
                    procview.sync_pid_links(self.root, self.twin.dir)
                last_pids = now
            self.apply_sysfs_writes(retry)
            try:
                names = os.listdir(self.requests)
            except FileNotFoundError:
                names = []  # mid-boot
            for name in sorted(names):
                if name.endswith(".json") and name not in self.seen:
                    self.seen.add(name)
                    self.work.put(self.requests / name)
            self.stopping.wait(0.05)
        worker.join(timeout=30)
        self.halt()
        (self.twin.dir / "ready").unlink(missing_ok=True)


def _removals_waiting(root: Path) -> bool:
    """Whether an nvidia unbind waits for a GPU's holders (hw.json remove_waiting)."""
    try:
        return bool(
            json.loads((root / "var/lib/gpuhost-twin/hw.json").read_text()).get("remove_waiting")
        )
    except (OSError, ValueError):
        return False


def answer(rc: int, stdout: str = "", stderr: str = "") -> dict[str, Any]:
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def main() -> None:
    Supervisor(Path(sys.argv[1])).run()


if __name__ == "__main__":
    main()
