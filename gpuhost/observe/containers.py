"""Facts about GPU containers: the installed pve-container, and each container's config file
(exact bytes and digest) and NVIDIA userspace, read in one command."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass, field

from gpuhost.observe.nvidia_driver import NvidiaUserspace, parse_userspace
from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe


@dataclass(frozen=True)
class PackageVersion:
    version: str | None  # None: the package is not installed


def parse_package_version(lines: list[str]) -> PackageVersion:
    """``ii 5.3.5`` (dpkg's status abbreviation and the version) -> 5.3.5; nothing: absent."""
    words = " ".join(lines).split()
    if not words:
        return PackageVersion(None)
    if len(words) != 2 or not re.fullmatch(r"[0-9][A-Za-z0-9.+~:-]*", words[1]):
        raise UnparsedOutput("dpkg-query pve-container", " ".join(lines))
    return PackageVersion(words[1] if words[0] == "ii" else None)


class PveContainerVersion(Probe[PackageVersion]):
    """
    Returns the installed pve-container package's version, ``PackageVersion("5.3.5")``, or
    ``PackageVersion(None)`` where it is not installed. pve-container implements devN entries
    (5.0.7 and later, Proxmox VE 8.1).
    """

    def command(self) -> str:
        return (
            "dpkg-query -W -f '${db:Status-Abbrev} ${Version}\\n' pve-container 2>/dev/null || true"
        )

    def process(self, output: list[str]) -> PackageVersion:
        return parse_package_version(output)


@dataclass
class ContainerState:
    ctid: int
    text: str | None = None  # /etc/pve/lxc/<ctid>.conf exactly as on disk; None: no such file
    digest: str | None = None  # its SHA-1, as Proxmox's config digest
    status: str | None = None  # `pct status`: running | stopped
    userspace: dict[str, list[str]] = field(default_factory=dict)  # inside, when running


_HEAD = re.compile(r"==> ct (?P<ctid>\d+) <==")


def parse_container_states(lines: list[str]) -> dict[int, ContainerState]:
    states: dict[int, ContainerState] = {}
    current: ContainerState | None = None
    for line in lines:
        head = _HEAD.fullmatch(line)
        if head:
            current = states.setdefault(int(head["ctid"]), ContainerState(int(head["ctid"])))
            continue
        if current is None:
            raise UnparsedOutput("container states", line, "line before any container header")
        key, _, value = line.partition(" ")
        if key == "conf":
            try:
                current.text = base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError) as exc:
                raise UnparsedOutput("container config", line, f"not base64 text: {exc}") from None
            current.digest = hashlib.sha1(current.text.encode()).hexdigest()
        elif key == "status":
            current.status = value.removeprefix("status: ") or None
        elif key == "lib":
            found = parse_userspace([value])
            for name, versions in found.items():
                have = current.userspace.setdefault(name, [])
                have.extend(v for v in versions if v not in have)
        else:
            raise UnparsedOutput("container states", line)
    return states


class ContainerStates(Probe[dict[int, ContainerState]]):
    """
    Returns, per container id, its config file (exact text and SHA-1 digest), `pct status`, and
    inside a running one the NVIDIA libraries the loader resolves (via `pct exec`):
    ``{200: ContainerState(200, text="arch: amd64\\n...", digest="3f2a...", status="running",
    userspace={"libcuda": ["595.71.05"], ...})}``.
    """

    default = dict

    def command(self, ctids: tuple[int, ...]) -> str:
        libs = NvidiaUserspace().command()
        quoted = libs.replace("'", "'\\''")
        parts = []
        for ctid in ctids:
            ctid = int(ctid)
            conf = f"/etc/pve/lxc/{ctid}.conf"
            parts.append(
                f'echo "==> ct {ctid} <=="; '
                f'if [ -f {conf} ]; then echo "conf $(base64 -w0 <{conf})"; '
                f'echo "status $(pct status {ctid} 2>/dev/null)"; '
                f"if pct status {ctid} 2>/dev/null | grep -qx 'status: running'; then "
                f"pct exec {ctid} -- sh -c '{quoted}' 2>/dev/null | sed 's/^/lib /'; fi; fi"
            )
        return "; ".join(parts) or "true"

    def process(self, output: list[str]) -> dict[int, ContainerState]:
        return parse_container_states(output)
