"""gpuhost's own pyinfra operations, in pyinfra's style: read state, compare, yield commands.

They compare against state read once per run in one batched fact (see deploys/context.py)
instead of probing the host per item, so a converged re-run costs one SSH round trip.
"""

from __future__ import annotations

import base64
import posixpath
import time

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, StringCommand, operation
from pyinfra.api.command import QuoteString

from facts.files import BootId
from facts.kernel import KernelCmdline


@operation()
def managed_file(path: str, content: str | None, current: str | None, mode: str = "644"):
    """
    Ensure a file holds exactly ``content``, or is absent when ``content`` is None.

    + path: remote path
    + content: wanted content (text), None to remove the file
    + current: the file's content now, from the batched ``ConfigFiles`` fact (None: absent)
    + mode: octal permissions of a written file

    The file is written to a temporary name and renamed, so a crash never leaves half a file
    behind (a truncated /etc/kernel/cmdline makes a host unbootable).

    **Example:**

    .. code:: python

        managed_file(
            name="nvidia_uvm options",
            path="/etc/modprobe.d/gpuhost-nvidia.conf",
            content="options nvidia_uvm uvm_disable_hmm=1\\n",
            current=None,
        )
    """
    if content == current:
        host.noop(f"{path} is {'up to date' if content is not None else 'absent'}")
        return
    if content is None:
        yield StringCommand("rm", "-f", QuoteString(path))
        return
    encoded = base64.b64encode(content.encode()).decode()
    tmp = f"{path}.gpuhost-new"
    yield StringCommand(
        "mkdir -p",
        QuoteString(posixpath.dirname(path)),
        "&& echo",
        encoded,
        "| base64 -d >",
        QuoteString(tmp),
        f"&& chmod {mode}",
        QuoteString(tmp),
        "&& mv -f",
        QuoteString(tmp),
        QuoteString(path),
    )


@operation(is_idempotent=False)
def reboot_and_confirm(
    reasons: list[str],
    boot_id: str,
    cmdline_present: list[str],
    cmdline_absent: list[str],
    delay: int = 10,
    timeout: int = 600,
):
    """
    Reboot because of ``reasons``, wait for the host, and confirm the new boot.

    + reasons: why (printed before the reboot); nothing happens when empty
    + boot_id: the boot id before the reboot; the host is back when it reports another one
    + cmdline_present / cmdline_absent: parameters /proc/cmdline must / must not carry after it
    + delay, timeout: seconds before the first reconnect attempt, and overall

    Unlike ``server.reboot``, which watches /proc/uptime drop (and can mistake the old boot
    for the new one when it reconnects within a second), this waits for a new boot id.
    """
    if not reasons:
        host.noop("no reboot needed")
        return
    for reason in reasons:
        logger.info(f"{host.print_prefix}reboot needed: {reason}")
    # Detached, so the SSH channel closes before the host goes down (see pyinfra #1708).
    yield StringCommand("( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &")

    def read(host, fact) -> object | None:
        """A fact read that may meet the old boot going down: None instead of failing the host
        (host.get_fact would mark the host failed on the dropped session)."""
        try:
            ok, output = host.run_shell_command(StringCommand(fact.command()), print_output=False)
        except Exception:  # paramiko's EOFError/SSHException/socket errors as sshd goes away
            return None
        return fact.process(output.stdout_lines) if ok and output.stdout_lines else None

    def wait_for_new_boot(state, host) -> bool:
        time.sleep(delay)
        deadline = time.monotonic() + timeout
        new_id = None
        while time.monotonic() < deadline:
            host.disconnect()
            host.connect(show_errors=False)
            if host.connected:
                new_id = read(host, BootId())
                cmdline = read(host, KernelCmdline())
                if new_id not in (None, boot_id) and cmdline is not None:
                    break
            time.sleep(1)
        else:
            raise OperationError(f"the host did not come back with a new boot within {timeout} s")
        missing = [p for p in cmdline_present if p not in cmdline]
        stale = [p for p in cmdline_absent if p in cmdline]
        if missing or stale:
            raise OperationError(
                f"after the reboot /proc/cmdline lacks {missing or 'nothing'} and still has "
                f"{stale or 'nothing'}: the boot loader did not take the new command line"
            )
        logger.info(f"{host.print_prefix}new boot {new_id}: kernel command line confirmed")
        return True

    yield FunctionCommand(wait_for_new_boot, (), {})
