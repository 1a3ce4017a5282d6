"""Device nodes as they are on a host or in a guest: the nodes CUDA opens and their numbers."""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.observe.parse import UnparsedOutput
from gpuhost.observe.probe import Probe

_KINDS = {
    "character special file": "c",
    "block special file": "b",
    "directory": "d",
    "symbolic link": "l",
}


@dataclass(frozen=True)
class DeviceNode:
    path: str
    kind: str  # "c" (char device), "b", "d" (directory), "l", "f" (anything else)
    major: int
    minor: int

    @property
    def numbers(self) -> str:
        return f"{self.major}:{self.minor}"


def parse_device_nodes(lines: list[str]) -> dict[str, DeviceNode]:
    """``stat -c '%n|%F|%t|%T'`` lines (major and minor in hex) -> path -> node."""
    nodes: dict[str, DeviceNode] = {}
    for line in lines:
        parts = line.split("|")
        if len(parts) != 4 or not parts[0].startswith("/"):
            raise UnparsedOutput("stat of /dev/nvidia*", line)
        path, kind, major, minor = parts
        try:
            numbers = int(major, 16), int(minor, 16)
        except ValueError:
            raise UnparsedOutput("stat of /dev/nvidia*", line, "major/minor not hex") from None
        nodes[path] = DeviceNode(path, _KINDS.get(kind, "f"), *numbers)
    return nodes


class NvidiaDeviceNodes(Probe[dict[str, DeviceNode]]):
    """
    Returns the NVIDIA device nodes (/dev/nvidia*, /dev/nvidia-caps/*) with their type and
    major:minor, e.g. ``{"/dev/nvidia-uvm": DeviceNode("/dev/nvidia-uvm", "c", 238, 0)}``.
    """

    default = dict

    def command(self) -> str:
        # A glob that matches nothing stays literal: stat then fails on it, which says "none".
        return "stat -c '%n|%F|%t|%T' /dev/nvidia* /dev/nvidia-caps/* 2>/dev/null; true"

    def process(self, output: list[str]) -> dict[str, DeviceNode]:
        return parse_device_nodes(output)
