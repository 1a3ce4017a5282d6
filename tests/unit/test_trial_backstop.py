"""files/gpuhost-trial-backstop, the trial boot's backstop deadline from the initramfs, run by sh
with its kernel files moved into a temporary directory and `sleep` recorded (the real boot is
the vm tier's: tests/vm). It acts only on the trial entry's gpuhost.trial_deadline, waits until
that many seconds after boot, then asks SysRq to sync, remount read-only and reboot."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from gpuhost.plan.driver.modconf import static_file
from gpuhost.plan.trial.backstop import BACKSTOP_PID, disarm
from gpuhost.plan.trial.params import BACKSTOP_GRACE_S, TRIAL_DEADLINE, trial_cmdline

SCRIPT = static_file("gpuhost-trial-backstop")


def _run(
    tmp_path: Path, cmdline: str, uptime: str = "42.17 80.00", printk: str | None = "7\t4\t1\t7"
) -> Path:
    for name in ("proc/sys/kernel", "dev", "run", "bin"):
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc/cmdline").write_text(cmdline + "\n")
    (tmp_path / "proc/uptime").write_text(uptime + "\n")
    if printk is not None:  # the console loglevel first (Documentation/admin-guide/sysctl)
        (tmp_path / "proc/sys/kernel/printk").write_text(printk + "\n")
    for name in ("proc/sysrq-trigger", "dev/kmsg", "dev/console"):
        (tmp_path / name).write_text("")
    sleep = tmp_path / "bin/sleep"
    sleep.write_text(f'#!/bin/sh\necho "$1" >> {tmp_path}/slept\n')
    sleep.chmod(0o755)
    script = tmp_path / "backstop"
    text = SCRIPT
    for path in ("/proc/", "/dev/kmsg", "/dev/console", "/run/"):
        text = text.replace(path, f"{tmp_path}{path}")
    script.write_text(text)
    env = {"PATH": f"{tmp_path}/bin:/usr/bin:/bin"}
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return tmp_path


def _wait_for(path: Path, text: str) -> str:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never held {text!r}: {path.read_text() if path.exists() else ''}")


def test_a_boot_without_the_trial_parameter_arms_nothing(tmp_path: Path) -> None:
    root = _run(tmp_path, "BOOT_IMAGE=/boot/vmlinuz root=UUID=x ro gpuhost.trial=1")
    assert not (root / "run/gpuhost-trial-backstop.pid").exists()
    assert (root / "dev/kmsg").read_text() == "" and not (root / "slept").exists()


@pytest.mark.parametrize("value", ["", "12x", "-5", "0x10"])
def test_a_malformed_deadline_arms_nothing(tmp_path: Path, value: str) -> None:
    root = _run(tmp_path, f"root=UUID=x {TRIAL_DEADLINE}={value}")
    assert not (root / "run/gpuhost-trial-backstop.pid").exists()


def test_the_trial_entry_arms_a_reboot_at_its_deadline_after_boot(tmp_path: Path) -> None:
    params = trial_cmdline(10, 1200)
    assert f"{TRIAL_DEADLINE}={1200 + BACKSTOP_GRACE_S}" in params
    root = _run(tmp_path, " ".join(["root=UUID=x", "ro", *params]), uptime="42.17 80.00")
    pid = int((root / "run/gpuhost-trial-backstop.pid").read_text())
    assert pid > 1
    # the wait counts from boot: 1260 s after it, 42 s have gone
    assert _wait_for(root / "slept", "\n").splitlines()[0] == str(1200 + BACKSTOP_GRACE_S - 42)
    kmsg = _wait_for(root / "dev/kmsg", "rebooting to the default entry")
    assert "<5>gpuhost: trial boot: backstop reboot in 1218s unless gpuhost confirms it" in kmsg
    assert "<3>gpuhost: trial boot not confirmed within 1260s of its start" in kmsg
    # sync, remount read-only, reboot: through the file it opened before /proc moved
    assert _wait_for(root / "proc/sysrq-trigger", "b\n") == "s\nu\nb\n"
    assert (root / "dev/console").read_text() == ""  # the kernel's line shows there already


@pytest.mark.parametrize(
    ("printk", "on_console"),
    [
        # a passphrase prompt turned console messages off (cryptsetup's askpass: klogctl(6))
        ("1\t4\t1\t7", True),
        # after switch_root: the backstop's /proc moved away with the initramfs
        (None, False),
    ],
)
def test_the_reason_reaches_the_console_when_kernel_messages_do_not(
    tmp_path: Path, printk: str | None, on_console: bool
) -> None:
    root = _run(tmp_path, f"{TRIAL_DEADLINE}=30", uptime="95.50 1.00", printk=printk)
    _wait_for(root / "proc/sysrq-trigger", "b\n")
    reason = "gpuhost: trial boot not confirmed within 30s of its start"
    assert reason in (root / "dev/kmsg").read_text()
    assert (reason in (root / "dev/console").read_text()) is on_console


def test_a_deadline_already_past_reboots_at_once(tmp_path: Path) -> None:
    root = _run(tmp_path, f"{TRIAL_DEADLINE}=30", uptime="95.50 1.00")
    assert _wait_for(root / "slept", "\n").splitlines()[0] == "0"
    _wait_for(root / "proc/sysrq-trigger", "b\n")


def test_disarm_stops_the_waiting_shell_and_its_sleep(tmp_path: Path) -> None:
    """gpuhost's gate disarms an armed backstop (gpuhost/plan/trial/backstop.py): the waiting
    shell and its sleep are gone, and nothing reaches SysRq."""
    root = tmp_path
    for name in ("proc", "dev", "run"):
        (root / name).mkdir()
    (root / "proc/cmdline").write_text(f"root=UUID=x {TRIAL_DEADLINE}=600\n")
    (root / "proc/uptime").write_text("5.00 1.00\n")
    (root / "proc/sysrq-trigger").write_text("")
    (root / "dev/kmsg").write_text("")
    (root / "dev/console").write_text("")
    text = SCRIPT
    for path in ("/proc/", "/dev/kmsg", "/dev/console", "/run/"):
        text = text.replace(path, f"{root}{path}")
    script = root / "backstop"
    script.write_text(text)
    subprocess.run(["sh", str(script)], check=True, env={"PATH": "/usr/bin:/bin"})
    pid = int((root / "run/gpuhost-trial-backstop.pid").read_text())
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    sleeper = int(children.stdout.split()[0])
    disarm_cmd = disarm().replace(BACKSTOP_PID, str(root / "run/gpuhost-trial-backstop.pid"))
    subprocess.run(["sh", "-c", disarm_cmd], check=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (_alive(pid) or _alive(sleeper)):
        time.sleep(0.05)
    assert not _alive(pid) and not _alive(sleeper)
    assert not (root / "run/gpuhost-trial-backstop.pid").exists()
    assert (root / "proc/sysrq-trigger").read_text() == ""


def _alive(pid: int) -> bool:
    """Running, not gone nor a zombie waiting for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
