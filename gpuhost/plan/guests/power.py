"""Which guests to stop and start around a reboot (or a GPU move), and in what order.

Pure functions over what the facts read: the guests' configs (`onboot`, `startup`) and which
guests run. The order is Proxmox's own (pve-manager Nodes.pm startall/stopall): start by
ascending `order` of the `startup` property, guests without an order last, vmid ascending within
one order; stop in exactly the reverse. gpuhost hands the guests to Proxmox's startall/stopall,
which apply this order themselves; computing it here names the order in the run's log and lets
operations that act on single guests (moving a GPU) follow it.

The record of guests to bring back is one ``<kind> <vmid>`` line per guest, so a run killed
between stopping them and starting them again knows on its next run what was running.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuhost.observe.proxmox import GuestConfig
from gpuhost.paths import STATE_DIR

RECORD = f"{STATE_DIR}/guests-before-reboot"  # the guests a run stopped and must start again
GuestId = tuple[str, int]  # ("lxc", 101) | ("qemu", 100)
NO_ORDER = 2**63 - 1  # Proxmox sorts a guest without `order` as LONG_MAX: last to start
_STARTUP_ITEM = re.compile(r"(?:(?P<key>order|up|down)=)?(?P<value>\d+)")
_RECORD_LINE = re.compile(r"(?P<kind>lxc|qemu) (?P<vmid>[1-9]\d{2,8})")


class StartupFormatError(ValueError):
    """A `startup` value outside Proxmox's grammar `[[order=]\\d+] [,up=\\d+] [,down=\\d+]`."""


@dataclass(frozen=True)
class Startup:
    order: int | None = None
    up: int | None = None  # seconds to wait after starting this guest
    down: int | None = None  # shutdown timeout of this guest


@dataclass(frozen=True)
class Guest:
    kind: str
    vmid: int
    onboot: bool = False
    startup: Startup = field(default_factory=Startup)

    @property
    def id(self) -> GuestId:
        return (self.kind, self.vmid)

    @property
    def word(self) -> str:
        return f"{'CT' if self.kind == 'lxc' else 'VM'} {self.vmid}"


def parse_startup(text: str) -> Startup:
    """The `startup` property: `order=2,up=30`, or a bare number as the order (`2,down=60`)."""
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _STARTUP_ITEM.fullmatch(item)
        key = (match["key"] or "order") if match else None
        if match is None or key in values or (match["key"] is None and values):
            raise StartupFormatError(f"startup: {text!r} is not [[order=]N][,up=N][,down=N]")
        values[str(key)] = int(match["value"])
    return Startup(**values)


def guests_from_configs(configs: Mapping[GuestId, GuestConfig]) -> dict[GuestId, Guest]:
    """Each guest's onboot and startup, from its current config (startall reads no pending)."""
    guests = {}
    for (kind, vmid), conf in configs.items():
        options = conf.current.options
        guests[(kind, vmid)] = Guest(
            kind=kind,
            vmid=vmid,
            onboot=options.get("onboot") == "1",
            startup=parse_startup(options.get("startup", "")),
        )
    return guests


def running(statuses: Mapping[GuestId, str]) -> set[GuestId]:
    return {guest for guest, status in statuses.items() if status == "running"}


def start_order(guests: Iterable[Guest]) -> list[Guest]:
    """startall's order: ascending `order` (none = last), then ascending vmid."""
    return sorted(guests, key=lambda g: (_order(g), g.vmid))


def stop_order(guests: Iterable[Guest]) -> list[Guest]:
    """stopall's order: the reverse of the start order."""
    return start_order(guests)[::-1]


def _order(guest: Guest) -> int:
    return NO_ORDER if guest.startup.order is None else guest.startup.order


def parse_record(text: str | None) -> set[GuestId]:
    """The guests a record says to bring back; a line gpuhost did not write is an error."""
    found: set[GuestId] = set()
    for line in (text or "").splitlines():
        match = _RECORD_LINE.fullmatch(line.strip())
        if match is None:
            raise ValueError(f"guest record: unexpected line {line!r}")
        found.add((match["kind"], int(match["vmid"])))
    return found


def render_record(guests: Iterable[GuestId]) -> str:
    return "".join(f"{kind} {vmid}\n" for kind, vmid in sorted(guests))


@dataclass(frozen=True)
class GuestPower:
    """What to do with the guests around one reboot."""

    stop: list[Guest]  # running now, in stop order
    start: list[Guest]  # to bring back after it, in start order
    record: str  # the record to keep on the host until they are back ("" = none)


def plan_guest_power(
    guests: Mapping[GuestId, Guest],
    statuses: Mapping[GuestId, str],
    recorded: set[GuestId],
    rebooting: bool,
) -> GuestPower:
    """Stop what runs (only when rebooting); bring back what runs plus what an earlier, killed
    run recorded. A recorded guest whose config is gone is dropped: there is nothing to start."""
    now = running(statuses) if rebooting else set()
    back = {g for g in now | recorded if g in guests}
    return GuestPower(
        stop=stop_order(guests[g] for g in now if g in guests),
        start=start_order(guests[g] for g in back),
        record=render_record(back),
    )
