"""A run killed in the middle of a kernel trial converges on the next run.

The pyinfra process is SIGKILLed right after the trial reboot went out (the twin's boot id
changed), before the run could reconnect and gate the new kernel. The host is then on the trial
kernel, unpinned, with its trial record: the next run must see that from the host alone
(gpuhost/plan/trial/state.py: record + running kernel + boot id), run the gate and commit without
another reboot, and the run after that changes nothing. Killed earlier, after the one-shot was
set but before the reboot, the next run starts the trial over (the one-shot is set again) and
ends the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from tests.e2e.conftest import deploy
from tests.e2e.guests import put
from tests.e2e.test_kill_and_rerun import kill_when, start
from tests.e2e.test_trial_deploy import NEW, OLD, boot_attempts, pinned, trial_twin
from twin import processes
from twin.pytest_plugin import PVE_DIRS

RECORD = "var/lib/gpuhost/trial"
HELD = "the onboot guests start once gpuhost has committed it"  # files/gpuhost-trial-hold


def pve_guests_state(twin) -> str:
    return twin.run("systemctl show -p ActiveState --value pve-guests.service")[1].strip()


HUNG = "run/gpuhost-test-hung"
SYSTEMCTL = "usr/local/bin/systemctl"  # the twin's shim


def hang_reboot(root: Path) -> None:
    """`systemctl reboot` in the twin records its pid and sleeps instead of rebooting."""
    shim = root / SYSTEMCTL
    shim.rename(shim.with_name("systemctl.real"))
    shim.write_text(
        '#!/bin/sh\nif [ "$1" = reboot ]; then echo $$ >/' + HUNG + "; exec sleep 300; fi\n"
        'exec "$0.real" "$@"\n'
    )
    shim.chmod(0o755)


def unhang_reboot(root: Path) -> None:
    shim = root / SYSTEMCTL
    shim.with_name("systemctl.real").rename(shim)
    hung = root / HUNG
    if hung.exists():  # the one sleeping process this test started, by its pid
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(hung.read_text()), signal.SIGKILL)


def converges(twin, inv) -> None:
    rerun = deploy(inv)
    assert rerun.rc == 0, rerun.output[-5000:]
    assert f"kernel {NEW} passed its trial boot" in rerun.output
    assert twin.run("uname -r")[1].strip() == NEW and pinned(twin) == NEW
    assert not (twin.root / RECORD).exists()
    again = deploy(inv)
    assert again.rc == 0 and not again.changed and again.reboots == 0, again.output[-3000:]


def ct_status(twin, ctid: int) -> str:
    return twin.run(f"pct status {ctid}")[1].split()[-1]


def wait_for(check, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return False


def test_killed_after_the_trial_reboot_before_the_gate(fresh, tmp_path):
    """Also: an onboot container (pve-guests.service starts it at boot) waits on the trial boot
    until the commit, so it never runs on the unconfirmed kernel with the trial's panic
    settings (files/gpuhost-trial-hold, run as pve-guests' ExecStartPre)."""
    twin, inv = trial_twin(fresh, tmp_path, "systemd-boot")
    twin.run(PVE_DIRS)
    put(twin, "/etc/pve/lxc/300.conf", "arch: amd64\nhostname: ct300\nostype: debian\nonboot: 1\n")
    boot_id = twin.boot_id()
    proc = start(inv)
    output = kill_when(proc, lambda: twin.boot_id() != boot_id)  # the trial reboot went out
    assert "passed its trial boot" not in output
    assert processes.wait_port(twin.address, 22, timeout=30), output
    # Where the kill left it: the trial kernel runs, nothing pinned it, the record is there.
    assert twin.run("uname -r")[1].strip() == NEW
    assert pinned(twin) == OLD and (twin.root / RECORD).exists()
    log = twin.twin.dir / "pve-guests.log"
    assert wait_for(lambda: log.exists() and HELD in log.read_text()), "pve-guests did not wait"
    assert ct_status(twin, 300) == "stopped"
    # systemd shows the oneshot unit starting until its startall is over: what a run that
    # booted waits for before its own guest starts and stops (deploys/guests.py)
    assert pve_guests_state(twin) == "activating"
    converges(twin, inv)
    assert [a["kernel"] for a in boot_attempts(twin)] == [NEW]  # no second reboot to get there
    assert wait_for(lambda: ct_status(twin, 300) == "running")  # the commit let it start
    # its start is over (real systemd then shows "active"; the twin, which has no unit file for
    # it, "inactive"): what the run waited for
    assert wait_for(lambda: pve_guests_state(twin) != "activating")


def test_killed_after_the_oneshot_before_the_reboot(fresh, tmp_path):
    twin, inv = trial_twin(fresh, tmp_path, "systemd-boot")
    boot_id = twin.boot_id()
    # The run reaches the reboot step only after its one-shot is set: hang `systemctl reboot`.
    hang_reboot(twin.root)
    try:
        output = kill_when(
            start(inv),
            lambda: (
                (twin.root / HUNG).read_text().strip() != ""
                if (twin.root / HUNG).exists()
                else False
            ),
        )
    finally:
        unhang_reboot(twin.root)
    assert twin.boot_id() == boot_id, output  # killed before any reboot
    assert (twin.root / RECORD).exists() and pinned(twin) == OLD
    converges(twin, inv)
