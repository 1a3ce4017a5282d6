"""Which guests run on this node, read where Proxmox's own running tests look."""

from __future__ import annotations

import re

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe

# --- pct list / qm list (captures before 2026-12-04) ---------------------------------------------

_LIST_HEADERS = {"lxc": ("VMID", "Status"), "qemu": ("VMID", "NAME")}
_LIST_MARK = re.compile(r"^==> (?P<kind>lxc|qemu) <==$")


def parse_guest_lists(lines: list[str]) -> dict[tuple[str, int], str]:
    """``{("lxc", 101): "running", ("qemu", 100): "stopped"}`` from `pct list` and `qm list`
    behind ``==> lxc <==`` / ``==> qemu <==`` marks (docs/reference/formats.md §2, §3).

    Rows are split on whitespace, not cut at the printf widths: a name wider than its column
    pushes the rest right. `pct list`: VMID Status [Lock] [Name], so the status is the second
    word. `qm list`: VMID NAME STATUS MEM BOOTDISK PID; the name is a DNS name (no spaces), so
    the status is third, or second in a 5-word row of a VM without a name.
    """
    statuses: dict[tuple[str, int], str] = {}
    kind: str | None = None
    for line in lines:
        mark = _LIST_MARK.match(line)
        if mark:
            kind = mark["kind"]
            continue
        words = line.split()
        if not words:
            continue
        if kind is None:
            raise UnparsedOutput("pct/qm list", line, "line before any list mark")
        if tuple(words[:2]) == _LIST_HEADERS[kind]:
            continue
        if not words[0].isdigit() or (kind == "qemu" and len(words) not in (5, 6)):
            raise UnparsedOutput(f"{'pct' if kind == 'lxc' else 'qm'} list", line)
        status = words[1] if kind == "lxc" or len(words) == 5 else words[2]
        statuses[(kind, int(words[0]))] = status
    return statuses


# --- which guests run now, as Proxmox itself tells ---------------------------------------------

# The command prints the guests configured on this node, the LXC monitor sockets, and for each
# VM its pid file's pid with that process's state and argv; the parser applies Proxmox's tests.
# Lines: "config lxc 200", "socket @/var/lib/lxc/200/command", "pid 129 4242",
# "state 129 S", "arg 129 -pidfile". (A capture of `pct list`/`qm list`, the command before
# 2026-12-04, still parses: parse_guest_lists.)
_STATUS_LINE = re.compile(
    r"^(?:config (?P<kind>lxc|qemu-server) (?P<cid>\d+)"
    r"|socket (?P<socket>\S+)"
    r"|(?P<key>pid|state|arg) (?P<vmid>\d+) (?P<value>.*))$"
)
_CT_SOCKET = re.compile(r"^@/var/lib/lxc/(?P<ctid>\d+)/command$")
_QEMU_ARGV0 = re.compile(r"(?:kvm|(?:^|/)qemu-system-[^/]+)$")


def _qemu_pidfile(argv: list[str]) -> str | None:
    """The value of ``-pidfile`` in QEMU's argv, read as qemu-server's parse_cmdline does:
    an option is a word starting with - or --, its value the next word not starting so."""
    options: dict[str, str | None] = {}
    pending: str | None = None
    for word in argv[1:]:
        if not word:
            continue
        if word.startswith("-"):
            if pending is not None:
                options[pending] = None
            pending = word.lstrip("-")
        elif pending is not None:
            options[pending], pending = word, None
    return options.get("pidfile")


def parse_guest_statuses(lines: list[str]) -> dict[tuple[str, int], str]:
    """``{("lxc", 200): "running", ("qemu", 129): "stopped"}`` by Proxmox's own tests:
    a container runs when its LXC monitor listens on ``@/var/lib/lxc/<vmid>/command``
    (pve-container PVE::LXC::list_active_containers); a VM runs when the pid in
    /var/run/qemu-server/<vmid>.pid is a live, non-zombie process whose argv is QEMU's with
    that ``-pidfile`` (qemu-server PVE::QemuServer::Helpers::vm_running_locally)."""
    if lines and _LIST_MARK.match(lines[0]):
        return parse_guest_lists(lines)
    configs: list[tuple[str, int]] = []
    sockets: set[int] = set()
    pids: dict[int, str] = {}
    states: dict[int, str] = {}
    argvs: dict[int, list[str]] = {}
    for line in lines:
        if not line.strip():
            continue
        m = _STATUS_LINE.match(line)
        if m is None:
            raise UnparsedOutput("guest statuses", line)
        if m["kind"]:
            configs.append(("lxc" if m["kind"] == "lxc" else "qemu", int(m["cid"])))
        elif m["socket"]:
            ct = _CT_SOCKET.match(m["socket"])
            if ct is None:
                raise UnparsedOutput("guest statuses", line, "not an LXC command socket")
            sockets.add(int(ct["ctid"]))
        elif m["key"] == "pid":
            pids[int(m["vmid"])] = m["value"]
        elif m["key"] == "state":
            states[int(m["vmid"])] = m["value"].split(" ", 1)[0]
        else:
            argvs.setdefault(int(m["vmid"]), []).append(m["value"])
    statuses: dict[tuple[str, int], str] = {}
    for kind, vmid in configs:
        if kind == "lxc":
            running = vmid in sockets
        else:
            argv = argvs.get(vmid, [])
            running = (
                bool(argv)
                and _QEMU_ARGV0.search(argv[0]) is not None
                and _qemu_pidfile(argv) == f"/var/run/qemu-server/{vmid}.pid"
                and states.get(vmid, "Z") not in ("Z", "X", "")
            )
        statuses[(kind, vmid)] = "running" if running else "stopped"
    return statuses


class GuestStatuses(Probe["dict[tuple[str, int], str]"]):
    """
    Returns each guest's status on this node: ``{("lxc", 101): "running", ("qemu", 100):
    "stopped"}``, read where Proxmox's own tools look (:func:`parse_guest_statuses`) rather
    than through `pct list` and `qm list`: those are two perl start-ups, about 0.3 s each on a
    real host, in a read every run waits for. Fails (and with it the run) when /etc/pve is not
    Proxmox's cluster file system: guests cannot be brought back safely from a host whose guest
    state cannot be read.
    """

    requires_command = "pct"
    default = dict

    def command(self) -> str:
        return (
            # pmxcfs makes /etc/pve/local (a link to this node's directory); without it the
            # config directories are empty, which must not read as "no guests"
            "[ -e /etc/pve/local ] || { echo '/etc/pve is not mounted (pve-cluster)' >&2; "
            "exit 1; }; "
            "for f in /etc/pve/lxc/*.conf /etc/pve/qemu-server/*.conf; do "
            '[ -f "$f" ] || continue; d=${f%/*}; n=${f##*/}; echo "config ${d##*/} ${n%.conf}"; '
            "done; "
            "awk '$NF ~ /^@\\/var\\/lib\\/lxc\\/[0-9]+\\/command$/ { print \"socket \" $NF }' "
            "/proc/net/unix; "
            "for f in /etc/pve/qemu-server/*.conf; do "
            '[ -f "$f" ] || continue; n=${f##*/}; id=${n%.conf}; p=/var/run/qemu-server/$id.pid; '
            '[ -r "$p" ] && read -r pid <"$p" || continue; '
            'case $pid in ""|*[!0-9]*) continue;; esac; '
            "[ -r /proc/$pid/stat ] && read -r st </proc/$pid/stat || continue; "
            'echo "pid $id $pid"; echo "state $id ${st##*) }"; '
            "tr '\\0' '\\n' </proc/$pid/cmdline | sed \"s/^/arg $id /\"; "
            "done"
        )

    def process(self, output: list[str]) -> dict[tuple[str, int], str]:
        return parse_guest_statuses(output)
