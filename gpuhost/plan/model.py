"""The parts of a Plan that the planning phases produce and share: who owns each GPU, the files
the host must hold, the steps those files need, and the reasons to reboot. Every phase imports
them from here; the Plan that gathers them is gpuhost/plan/make.py's."""

from __future__ import annotations

from dataclasses import dataclass

from gpuhost.paths import STATE_DIR

# Concerns whose reboot this deploy makes; the others wait for the deploys that will own them.
REBOOT_NOW = ("cmdline", "modules")


class PlanError(ValueError):
    """The spec cannot be applied to this host; every problem is listed."""

    def __init__(self, host: str, problems: list[str], source: str | None = None) -> None:
        self.host, self.problems, self.source = host, problems, source
        where = f"{source}: " if source else ""
        lines = [f"{where}host {host!r}: the plan is refused ({len(problems)} problem(s))"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class Owner:
    kind: str  # "host" | "lxc" | "vm"
    id: int | None = None
    name: str = ""

    def __str__(self) -> str:
        return "host" if self.kind == "host" else f"{self.kind} {self.id} ({self.name})"


HOST = Owner("host")


@dataclass(frozen=True)
class GpuAssignment:
    index: int  # PCI bus order = nvidia-smi index while every GPU is on the nvidia driver
    bdf: str
    model: str
    numa_node: int | None
    iommu_group: int | None
    driver_now: str | None
    driver_planned: str  # "nvidia" | "vfio-pci"
    owner: Owner
    functions: tuple[str, ...] = ()  # other functions of the board (audio...) that go with it


@dataclass(frozen=True)
class ManagedFile:
    """A file the host must hold exactly (or not hold: ``content`` None), or a symlink."""

    path: str
    content: str | None
    concern: str  # "cmdline" | "modules" | "devices" | "trial" | "userspace" | "mappings" ...
    mode: str = "644"
    link: str | None = None  # a symlink to this target instead of content

    @property
    def present(self) -> bool:
        return self.content is not None or self.link is not None


@dataclass(frozen=True)
class FollowUp:
    """A step that must run after some managed files change, until it has succeeded once.

    A run records it as pending on the host (``marker``) before it writes any trigger file and
    clears it when the step succeeds, so a run killed in between still runs it next time.
    """

    name: str
    command: str
    triggers: tuple[str, ...]  # managed file paths

    @property
    def marker(self) -> str:
        return f"{STATE_DIR}/pending-{self.name}"


@dataclass(frozen=True)
class Reason:
    """Why a reboot will be needed, tagged with the concern that resolves it."""

    concern: str  # "cmdline" | "modules" | "kernel" | "driver" | "binding"
    text: str

    def __str__(self) -> str:
        return self.text
