"""What a workload in a guest starts with: the environment of a login shell."""

from __future__ import annotations

import re

from gpuhost.observe.probe import Probe

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_environment(lines: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition("=")
        if sep and _NAME.fullmatch(name):
            env[name] = value  # a line without NAME= continues a multi-line value: skipped
    return env


class LoginEnvironment(Probe[dict[str, str]]):
    """
    Returns the environment a login shell gets (/etc/profile, /etc/profile.d), where managed
    NCCL/CUDA variables such as NCCL_P2P_DISABLE must be.
    """

    default = dict

    def command(self) -> str:
        return "env -i HOME=/root PATH=/usr/bin:/bin sh -lc env"

    def process(self, output: list[str]) -> dict[str, str]:
        return parse_environment(output)
