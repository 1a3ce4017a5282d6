"""What a live rebind of one board must know: each function's driver, override, IOMMU group,
nvidia minor and vendor id as its config space reads back now; who holds the GPU's /dev/nvidiaN or the group's /dev/vfio/N; persistence.

Holders are found the way lsof and fuser do, from /proc/<pid>/fd, but matched by device
number rather than by path: a container's own node (Proxmox makes one per devN entry) has
another inode than the host's /dev/nvidiaN, so `fuser /dev/nvidia0` on the host misses it.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe
from gpuhost.spec.values import normalize_bdf


@dataclass(frozen=True)
class FunctionState:
    bdf: str
    driver: str | None  # bound now
    override: str | None  # driver_override, None for (null)
    iommu_group: int | None
    minor: int | None  # nvidia device minor (/dev/nvidiaN), while bound to nvidia


@dataclass(frozen=True)
class Holder:
    pid: int
    comm: str
    device: str  # "195:2", or the vfio group node's major:minor
    guest: str | None  # "CT 200", "VM 129" (from its cgroup), None for a host process

    def __str__(self) -> str:
        where = f", {self.guest}" if self.guest else ""
        return f"pid {self.pid} ({self.comm}{where})"


@dataclass(frozen=True)
class BoardState:
    functions: dict[str, FunctionState] = field(default_factory=dict)
    holders: list[Holder] = field(default_factory=list)
    persistence: dict[str, bool] = field(default_factory=dict)  # GPU BDF -> persistence mode on
    compute_apps: list[tuple[str, int, str]] = field(default_factory=list)  # (bdf, pid, name)
    # vendor id read live from each function's config space ("ffff": it does not answer)
    config_vendor: dict[str, str] = field(default_factory=dict)


def _bus_bdf(text: str) -> str:
    """nvidia-smi's bus id (00000000:C1:00.0) -> 0000:c1:00.0."""
    return normalize_bdf(text.strip()[-12:])


def _guest(cgroup: str) -> str | None:
    for pattern, kind in (
        (r"/lxc/(\d+)(?:/|$)", "CT"),
        (r"lxc\.payload\.(\d+)", "CT"),
        (r"qemu\.slice/(\d+)\.scope", "VM"),
    ):
        m = re.search(pattern, cgroup)
        if m:
            return f"{kind} {m.group(1)}"
    return None


def parse_board_state(lines: list[str]) -> BoardState:
    state = BoardState()
    for line in lines:
        kind, _, rest = line.partition(" ")
        words = rest.split(" ")
        try:
            if kind == "F" and len(words) == 5:
                bdf, driver, override, group, minor = words
                state.functions[bdf] = FunctionState(
                    bdf=normalize_bdf(bdf),
                    driver=None if driver == "-" else driver,
                    override=None if override == "-" else override,
                    iommu_group=None if group == "-" else int(group),
                    minor=None if minor == "-" else int(minor),
                )
            elif kind == "H" and len(words) >= 3:
                dev, pid, comm = words[:3]
                major, minor = (int(n, 16) for n in dev.split(":"))
                cgroup = " ".join(words[3:])
                state.holders.append(Holder(int(pid), comm, f"{major}:{minor}", _guest(cgroup)))
            elif kind == "P":
                bus, mode = (w.strip() for w in rest.split(","))
                state.persistence[_bus_bdf(bus)] = mode == "Enabled"
            elif kind == "C" and len(words) == 2 and re.fullmatch(r"[0-9a-f]{4}|-", words[1]):
                state.config_vendor[normalize_bdf(words[0])] = words[1]
            elif kind == "A":
                bus, pid, name = (w.strip() for w in rest.split(",", 2))
                state.compute_apps.append((_bus_bdf(bus), int(pid), name))
            else:
                raise ValueError(kind)
        except ValueError as exc:
            raise UnparsedOutput("the board's binding state", line) from exc
    return state


# One command: the functions' sysfs state, the device numbers that pin them, every process
# whose open files include one of those devices, persistence and compute apps from nvidia-smi.
_SCRIPT = r"""want=""
for b in {bdfs}; do
  d=/sys/bus/pci/devices/$b
  drv=$(readlink "$d/driver" 2>/dev/null); drv=${{drv##*/}}
  ovr=$(cat "$d/driver_override" 2>/dev/null); case "$ovr" in ""|"(null)") ovr=- ;; esac
  grp=$(readlink "$d/iommu_group" 2>/dev/null); grp=${{grp##*/}}
  min=$(sed -n 's/^Device Minor:[[:space:]]*//p' "/proc/driver/nvidia/gpus/$b/information" 2>/dev/null)
  echo "F $b ${{drv:--}} $ovr ${{grp:--}} ${{min:--}}"
  ven=$(od -An -tx2 -N2 "$d/config" 2>/dev/null | tr -d ' ')
  echo "C $b ${{ven:--}}"
  [ -z "$min" ] || want="$want c3:$(printf %x "$min")"
  [ -z "$grp" ] || [ ! -c "/dev/vfio/$grp" ] || want="$want $(stat -c %t:%T "/dev/vfio/$grp")"
done
if [ -n "$want" ]; then
  stat -L -c '%t:%T %n' /proc/[0-9]*/fd/* 2>/dev/null | while read -r dev path; do
    case " $want " in *" $dev "*) pid=${{path#/proc/}}; echo "$dev ${{pid%%/*}}" ;; esac
  done | sort -u | while read -r dev pid; do
    comm=$(tr -c 'A-Za-z0-9._\n-' _ < "/proc/$pid/comm" 2>/dev/null) || continue
    echo "H $dev $pid $comm $(tr '\n' ' ' < "/proc/$pid/cgroup" 2>/dev/null)"
  done
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  out=$(nvidia-smi --query-gpu=pci.bus_id,persistence_mode --format=csv,noheader 2>/dev/null) && printf '%s\n' "$out" | sed -n 's/^\(.\+\)$/P \1/p'
  out=$(nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name --format=csv,noheader 2>/dev/null) && printf '%s\n' "$out" | sed -n 's/^\([0-9A-Fa-f]\+:.\+\)$/A \1/p'
fi
true"""


class BoardBinding(Probe[BoardState]):
    """
    Returns the binding state of one board's functions and what holds it:

    .. code:: python

        BoardState(functions={"0000:c1:00.0": FunctionState(driver="nvidia", minor=6, ...)},
                   holders=[Holder(pid=4242, comm="python3", device="195:6", guest="CT 200")],
                   persistence={"0000:c1:00.0": True}, compute_apps=[])
    """

    default = BoardState

    def command(self, bdfs: tuple[str, ...]) -> str:
        checked = [normalize_bdf(b) for b in bdfs]  # strict grammar before the shell sees it
        return _SCRIPT.format(bdfs=" ".join(shlex.quote(b) for b in checked))

    def process(self, output: list[str]) -> BoardState:
        return parse_board_state(output)
