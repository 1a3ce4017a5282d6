"""A GPU guest's software plan as data: the toolkits, venvs and services it holds, what the
control machine contributes, and the paths gpuhost manages in the guest. Made by
gpuhost/guestsw/plan.py; applied by deploys/guest_software.py, checked by the audit."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuhost.guestsw.indexconf import IndexConfig
from gpuhost.observe.guestsoft import HOOK, SERVICE_STAMPS
from gpuhost.plan.model import ManagedFile

KEYRING = "/etc/apt/keyrings/gpuhost-cuda.asc"
SOURCES = "/etc/apt/sources.list.d/gpuhost-cuda.sources"
UV_CONFIG = "/etc/uv/uv.toml"
INDEX_CA = "/etc/gpuhost/index-ca.pem"  # the control machine's CA bundle for the indexes
PROFILE = "/etc/profile.d/gpuhost-env.sh"
VENV_CONFIG = "/etc/gpuhost/venvs"  # <venv path>/{requirements.txt,constraints.txt,env,env.sh}


class GuestPlanError(ValueError):
    def __init__(self, guest: str, problems: list[str]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{guest}: the guest software plan is refused:\n{lines}")


@dataclass(frozen=True)
class Control:
    """What the control machine contributes: uv to push, the repository key, the indexes."""

    machine: str  # platform.machine()
    uv_path: str | None
    uv_sha256: str | None
    keyring: str | None  # the key file's text; None: unreadable (keyring_error says why)
    keyring_error: str | None = None
    indexes: IndexConfig = field(default_factory=IndexConfig)
    index_ca: str | None = None  # the text of indexes.cert


@dataclass(frozen=True)
class Toolkit:
    version: str  # 12.8

    @property
    def package(self) -> str:
        return "cuda-toolkit-" + self.version.replace(".", "-")

    @property
    def prefix(self) -> str:
        return f"/usr/local/cuda-{self.version}"


@dataclass(frozen=True)
class VenvPlan:
    path: str
    python: str
    create: str | None  # why it is (re)created; None: it is there with that python
    install: str | None  # why the requirements are installed now; None: converged
    hook: bool  # bin/activate must get the line that sources env.sh
    pins: dict[str, str]  # normalised name -> version
    imports: tuple[str, ...]
    stamp: str
    cuda_home: str | None
    config_dir: str

    @property
    def requirements(self) -> str:
        return f"{self.config_dir}/requirements.txt"

    @property
    def constraints(self) -> str:
        return f"{self.config_dir}/constraints.txt"

    @property
    def env_file(self) -> str:
        return f"{self.config_dir}/env"

    @property
    def env_sh(self) -> str:
        return f"{self.config_dir}/{HOOK}"


@dataclass(frozen=True)
class ServicePlan:
    name: str
    venv: str
    unit_path: str
    stamp: str
    enable: bool
    restart: str | None  # why it is (re)started now; None: it runs the planned state

    @property
    def unit(self) -> str:
        return f"gpuhost-{self.name}.service"

    @property
    def stamp_path(self) -> str:
        return f"{SERVICE_STAMPS}/service-{self.name}.stamp"


@dataclass
class GuestPlan:
    guest: str
    driver: str | None
    env: dict[str, str]  # the guest-wide environment (profile.d)
    max_jobs: int
    max_jobs_rule: str
    files: dict[str, ManagedFile]
    toolkits: list[Toolkit]
    install_toolkits: list[str]  # packages to install now
    default: Toolkit | None
    set_default: bool
    push_uv: bool
    uv_path: str | None
    venvs: list[VenvPlan]
    services: list[ServicePlan]
    notes: list[str] = field(default_factory=list)
    uv_env: dict[str, str] = field(default_factory=dict)  # for uv's own commands only
