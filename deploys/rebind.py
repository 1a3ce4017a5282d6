"""Move one board between nvidia and vfio-pci while the host runs: no reboot.

The board is every function of the GPU's slot (gpuhost.plan.guests.vfio.board_functions); all of them
move together, or none.

nvidia -> vfio-pci: refused, naming each process (and its guest, from its cgroup), while
anything but nvidia-persistenced holds the GPU's /dev/nvidiaN or nvidia-smi lists a compute
app on it: the nvidia driver's remove path (nv_pci_remove, nv-pci.c) does not fail on a held
GPU, it waits until the usage count drops, so an unbind with a user left would hang the
writer. nvidia-persistenced holds every GPU; it is asked to let go of this one only
(`nvidia-smi -i <bdf> -pm 0`, which nvidia-smi hands to the daemon's per-device RPC,
nvpdsetpersistencemode, command_server.c), so the other GPUs keep their persistence and the
daemon keeps running. The holders are checked again right before the unbind. Then each
function gets driver_override=vfio-pci, is unbound from its driver, and vfio-pci probes it;
the command waits until sysfs shows vfio-pci on every function.

vfio-pci -> nvidia: refused while a process (QEMU: the VM is running) holds the group's
/dev/vfio/N. Each function is reset first where the kernel offers a reset method (the VM may
have been stopped hard), and must read back its config space (else refused, left on vfio-pci).
The overrides are cleared, the functions unbound and probed by their own drivers
(nvidia, snd_hda_intel), then nvidia-modprobe makes the GPU's /dev/nvidiaN node (the driver
makes none), as deploys/devices.py's boot unit does. Where the host's other GPUs are in
persistence mode, the returned one is put back into it (`nvidia-smi -i <bdf> -pm 1`),
restarting nvidia-persistenced's unit when the daemon does not know the GPU.

The boot-time claim (deploys/vfio.py) follows the Plan, so a move the inventory does not
also make is undone by the next boot.
"""

from __future__ import annotations

import shlex

from pyinfra import host
from pyinfra.api import OperationError, StringCommand, operation

from facts.rebind import BoardBinding
from gpuhost.observe.rebind import BoardState
from gpuhost.spec.values import normalize_bdf

DRIVERS = ("vfio-pci", "nvidia")
PERSISTENCED = "nvidia-persiste"  # its comm: the kernel keeps 15 characters (TASK_COMM_LEN)


def refusal(state: BoardState, functions: tuple[str, ...], driver: str) -> str | None:
    """Why the board cannot move to ``driver`` now (naming who holds it), or None."""
    gpu = functions[0]
    if driver == "vfio-pci":
        minors = {f"195:{s.minor}" for s in state.functions.values() if s.minor is not None}
        users = [h for h in state.holders if h.device in minors and h.comm != PERSISTENCED]
        apps = [f"pid {pid} ({name})" for bdf, pid, name in state.compute_apps if bdf in functions]
        held = [str(h) for h in users] + [
            a for a in apps if not any(a.startswith(f"pid {h.pid} ") for h in users)
        ]
        if held:
            return (
                f"GPU {gpu} is in use by {', '.join(held)}: stop the guest or process first "
                "(unbinding nvidia from a GPU in use waits until it is released)"
            )
    else:
        dead = [f for f in functions if state.config_vendor.get(f) in ("ffff", "-")]
        if dead:
            return (
                f"{', '.join(dead)}: config space reads back "
                f"{state.config_vendor[dead[0]]} (vendor id 0xffff: the function does not "
                "answer): not binding nvidia; the board stays on vfio-pci; power-cycle the host "
                "to recover it"
            )
        minors = {f"195:{s.minor}" for s in state.functions.values() if s.minor is not None}
        users = [h for h in state.holders if h.device not in minors]
        if users:
            return (
                f"GPU {gpu} is in use through vfio by {', '.join(map(str, users))}: stop the VM "
                "first"
            )
    return None


def rebind_script(state: BoardState, functions: tuple[str, ...], driver: str, wait: int) -> str:
    """The shell that moves the board; it re-checks holders and verifies sysfs at the end."""
    q = [shlex.quote(f) for f in functions]
    lines = ["set -u", f"FUNCTIONS={shlex.quote(' '.join(functions))}"]
    minors = [s.minor for s in state.functions.values() if s.minor is not None]
    if driver == "vfio-pci":
        for bdf in functions:
            if state.persistence.get(bdf):
                lines.append(f"nvidia-smi -i {shlex.quote(bdf)} -pm 0 >/dev/null || exit 1")
        for minor in minors:  # a process that opened the GPU since the facts were read
            lines.append(
                "held=$(stat -L -c '%t:%T %n' /proc/[0-9]*/fd/* 2>/dev/null | "
                f"grep -c '^c3:{minor:x} ') || true"
            )
            lines.append(
                f'[ "$held" = 0 ] || {{ echo "GPU {functions[0]} was opened again '
                f'(/dev/nvidia{minor}): not unbinding" >&2; exit 1; }}'
            )
    if driver == "nvidia":
        lines += _reset_and_check(functions)
    override = "vfio-pci" if driver == "vfio-pci" else ""
    lines += [
        "for f in $FUNCTIONS; do",
        "  d=/sys/bus/pci/devices/$f",
        f'  echo "{override}" > "$d/driver_override" || exit 1',
        '  drv=$(readlink "$d/driver"); drv=${drv##*/}',
        f'  if [ -n "$drv" ] && [ "$drv" != "{driver}" ]; then echo "$f" > "$d/driver/unbind" || exit 1; fi',
        "done",
    ]
    lines += [
        # an unbind completes before the write returns; wait for sysfs all the same (bounded),
        # so a remove that does not finish is reported instead of probed over
        f"i=0; while [ $i -lt {wait * 10} ]; do",
        "  left=",
        "  for f in $FUNCTIONS; do",
        '    drv=$(readlink "/sys/bus/pci/devices/$f/driver"); drv=${drv##*/}',
        f'    if [ -n "$drv" ] && [ "$drv" != "{driver}" ]; then left="$left $f($drv)"; fi',
        "  done",
        '  [ -z "$left" ] && break',
        "  sleep 0.1; i=$((i + 1))",
        "done",
        f'[ -z "$left" ] || {{ echo "still bound after {wait} s:$left" >&2; exit 1; }}',
    ]
    if driver == "vfio-pci":
        lines.append("modprobe vfio-pci || exit 1")
    lines += [
        "for f in $FUNCTIONS; do",
        '  [ -e "/sys/bus/pci/devices/$f/driver" ] || echo "$f" > /sys/bus/pci/drivers_probe',
        "done",
        # the kernel binds at the write; a driver may probe asynchronously: wait, bounded
        f"i=0; while [ $i -lt {wait * 10} ]; do",
        "  ok=1",
        "  for f in $FUNCTIONS; do",
        '    drv=$(readlink "/sys/bus/pci/devices/$f/driver"); drv=${drv##*/}',
        '    [ -n "$drv" ] || ok=0',
        f'    if [ "{driver}" = vfio-pci ] && [ "$drv" != vfio-pci ]; then ok=0; fi',
        "  done",
        f'  drv=$(readlink /sys/bus/pci/devices/{q[0]}/driver); [ "${{drv##*/}}" = "{driver}" ] || ok=0',
        # nvidia's probe makes the GPU's /proc/driver/nvidia entry, which names its minor
        f"  [ {driver} != nvidia ] || [ -e /proc/driver/nvidia/gpus/{q[0]}/information ] || ok=0",
        '  [ "$ok" = 1 ] && break',
        "  sleep 0.1; i=$((i + 1))",
        "done",
        'if [ "$ok" != 1 ]; then',
        "  for f in $FUNCTIONS; do",
        '    drv=$(readlink "/sys/bus/pci/devices/$f/driver"); echo "$f is bound to ${drv##*/}" >&2',
        "  done",
        f'  echo "the board did not move to {driver} within {wait} s" >&2; exit 1',
        "fi",
    ]
    if driver == "nvidia":
        lines += [
            f"m=$(sed -n 's/^Device Minor:[[:space:]]*//p' /proc/driver/nvidia/gpus/{q[0]}/information)",
            '[ -n "$m" ] && nvidia-modprobe -c "$m" || { echo "no /dev/nvidia node for '
            f'{functions[0]}" >&2; exit 1; }}',
        ]
        if any(state.persistence.values()):
            # The host keeps its GPUs in persistence mode: ask nvidia-persistenced to take this
            # one again as well, restarting it where it does not know the GPU.
            lines += _persistence_back(functions[0])
    return "\n".join(lines)


def _reset_and_check(functions: tuple[str, ...]) -> list[str]:
    """Before nvidia probes a board that a VM had (maybe stopped hard, its GPU mid-work): a
    function reset where the kernel offers one (`reset_method` lists the methods; empty or
    absent: none, Documentation/ABI/testing/sysfs-bus-pci), done while vfio-pci still holds
    it; then its config space must read back (vendor id 0xffff: the function no longer
    answers), else the move is refused with the board left on vfio-pci. `config` is read live;
    sysfs `vendor` is the value cached at enumeration."""
    return [
        "for f in $FUNCTIONS; do",
        "  d=/sys/bus/pci/devices/$f",
        '  m=$(cat "$d/reset_method" 2>/dev/null) || m=',
        '  if [ -n "$m" ]; then',
        '    echo 1 > "$d/reset" || { echo "$f: the function reset ($m) failed: not binding '
        'nvidia; power-cycle the host to recover the board" >&2; exit 1; }',
        "  fi",
        '  v=$(od -An -tx2 -N2 "$d/config" 2>/dev/null | tr -d " ")',
        '  if [ -z "$v" ] || [ "$v" = ffff ]; then',
        '    echo "$f: its config space reads back ${v:-nothing} (vendor id 0xffff: the function '
        "does not answer): not binding nvidia; the board stays on vfio-pci; power-cycle the "
        'host to recover it" >&2; exit 1',
        "  fi",
        "done",
    ]


# nvidia-persistenced builds its device table once, when it starts (nvidia-persistenced.c:
# setup_devices(), called from main), from the GPUs the nvidia driver has then. A GPU that was on
# vfio-pci at that time is not in it: the per-device request behind `nvidia-smi -pm 1` answers
# NVPD_ERR_DEVICE_NOT_FOUND (nvPdSetDevicePersistenceMode). A restart builds the table again.
PERSISTENCED_UNITS = ("gpuhost-nvidia-persistenced.service", "nvidia-persistenced.service")


def _persistence_back(gpu: str) -> list[str]:
    q = shlex.quote(gpu)
    return [
        f"if ! nvidia-smi -i {q} -pm 1 >/dev/null 2>&1; then",
        "  unit=",
        f"  for u in {' '.join(PERSISTENCED_UNITS)}; do",
        '    if systemctl is-active --quiet "$u"; then unit=$u; break; fi',
        "  done",
        '  if [ -z "$unit" ]; then',
        f'    echo "nvidia-persistenced does not know GPU {gpu} (it started while the GPU was '
        f"not on nvidia) and runs under none of {', '.join(PERSISTENCED_UNITS)}: restart it, "
        f'then nvidia-smi -i {gpu} -pm 1" >&2; exit 1',
        "  fi",
        '  echo "nvidia-persistenced does not know GPU ' + gpu + ': restarting $unit"',
        '  systemctl restart "$unit" || exit 1',
        f"  nvidia-smi -i {q} -pm 1 >/dev/null || exit 1",
        "fi",
    ]


@operation(is_idempotent=False)
def rebind(functions: tuple[str, ...], driver: str, wait: int = 10):
    """
    Move one board (all its functions) to ``driver`` without a reboot, or refuse saying who
    holds it.

    + functions: the board's PCI addresses, the GPU first (``vfioplan.board_functions``)
    + driver: ``"vfio-pci"`` (for a VM) or ``"nvidia"`` (back to the host)
    + wait: seconds to wait for sysfs to show the new driver on every function

    **Example:**

    .. code:: python

        rebind(
            name="GPU 0000:c1:00.0 to vfio-pci",
            functions=("0000:c1:00.0", "0000:c1:00.1"),
            driver="vfio-pci",
        )
    """
    if driver not in DRIVERS:
        raise OperationError(f"`driver` must be one of {', '.join(DRIVERS)}, not {driver!r}")
    if not functions:
        raise OperationError("`functions` must name the board's PCI functions, the GPU first")
    try:
        board = tuple(dict.fromkeys(normalize_bdf(f) for f in functions))
    except (TypeError, ValueError) as exc:
        raise OperationError(f"`functions`: {exc}") from exc
    state = host.get_fact(BoardBinding, bdfs=board)
    missing = [f for f in board if f not in state.functions]
    if missing:
        raise OperationError(f"{', '.join(missing)}: no such PCI function on this host")
    now = {f: state.functions[f].driver for f in board}
    if driver == "vfio-pci" and set(now.values()) == {"vfio-pci"}:
        host.noop(f"{board[0]} and its functions are bound to vfio-pci")
        return
    if driver == "nvidia" and now[board[0]] == "nvidia" and "vfio-pci" not in now.values():
        host.noop(f"{board[0]} is bound to nvidia")
        return
    why = refusal(state, board, driver)
    if why:
        raise OperationError(why)
    yield StringCommand(rebind_script(state, board, driver, wait))
