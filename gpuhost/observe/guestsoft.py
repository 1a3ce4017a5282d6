"""A GPU guest's software state, read in one command: what the guest deploy compares against.

Keys of one :class:`facts.snapshot.Combined` run (each a command and a pure parser below):
the host driver as the guest sees it (/proc/driver/nvidia/version), cores and memory (the
cgroup's limit where there is one), the managed files, the installed CUDA toolkit packages and
the `cuda` alternative, uv, each venv (its pyvenv.cfg, install stamp, activation hook and
installed distributions) and each service (systemd's view and the stamp it was started with).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from gpuhost.observe.files import ManagedFiles, parse_managed_files
from gpuhost.observe.nvidia_driver import DriverVersion, parse_driver_version
from gpuhost.observe.parse import UnparsedOutput
from gpuhost.paths import STATE_DIR

# apt's verifiers (APT_VERIFIER below): sqv is apt's method on Debian 13 (apt
# 2.9.19 "Replace GnuPG with Sequoia", NEWS.Debian); "sqv-policy": an operator's policy file
# overrides Debian's; gpgv: apt before 2.9.19 (Debian 12, Ubuntu 22.04 and 24.04).
SQV, SQV_POLICY, GPGV = "sqv", "sqv-policy", "gpgv"
_OS_LINE = re.compile(r"(?P<key>[A-Z][A-Z0-9_]*)=(?P<value>\"[^\"\\`$]*\"|'[^']*'|[^\s\"'\\`$]*)")


@dataclass(frozen=True)
class GuestOs:
    id: str  # os-release ID, e.g. debian, ubuntu
    version_id: str  # VERSION_ID, e.g. 13, 24.04 (empty on Debian testing/sid)
    pretty: str  # PRETTY_NAME, for messages


def parse_os_release(lines: list[str]) -> GuestOs | None:
    """os-release(5) text -> GuestOs; None when it names no ID (no os-release at all).

    Lines that do not fit the KEY=value grammar (comments, blank lines) are ignored."""
    values: dict[str, str] = {}
    for line in lines:
        match = _OS_LINE.fullmatch(line.strip())
        if match:
            values[match["key"]] = match["value"].strip("\"'")
    if not values.get("ID"):
        return None
    return GuestOs(
        values["ID"], values.get("VERSION_ID", ""), values.get("PRETTY_NAME", values["ID"])
    )


UV_PATH = "/usr/local/bin/uv"
STAMP = ".gpuhost-stamp"  # in a venv: the install it holds (guestplan.venv_stamp)
HOOK = "gpuhost-env.sh"  # in a venv: sourced by bin/activate
SERVICE_STAMPS = STATE_DIR  # service-<name>.stamp: the state it was (re)started with
_DIST = re.compile(r"(?P<name>\S+) (?P<version>\S+)")


@dataclass(frozen=True)
class System:
    machine: str  # uname -m
    cpus: int  # nproc (the cpuset/affinity the guest gets)
    mem_total: int  # bytes, /proc/meminfo MemTotal
    mem_limit: int | None  # bytes, the cgroup's memory.max; None: unlimited / no cgroup v2


@dataclass(frozen=True)
class VenvState:
    python: str | None  # pyvenv.cfg version_info / version; None: no venv there
    exists: bool  # the path exists (a venv or not)
    stamp: str | None
    hooked: bool  # bin/activate sources gpuhost-env.sh
    dists: dict[str, str] = field(default_factory=dict)  # normalised name -> version
    imports: str | None = None  # the audit's import probe: "ok", or the error; None: not run


@dataclass(frozen=True)
class ServiceState:
    active: str  # ActiveState ("active", "inactive", "failed", "" when unknown)
    enabled: str  # UnitFileState
    pid: int  # MainPID (0: none)
    stamp: str | None
    environ: dict[str, str] = field(default_factory=dict)  # /proc/<MainPID>/environ


@dataclass(frozen=True)
class GuestFacts:
    driver: DriverVersion | None
    system: System
    files: ManagedFiles
    toolkits: dict[str, str]  # installed package -> version (cuda-toolkit-X-Y)
    cuda_alternative: str | None  # readlink /etc/alternatives/cuda
    cuda_link: str | None  # readlink /usr/local/cuda
    uv_sha256: str | None
    venvs: dict[str, VenvState]
    services: dict[str, ServiceState]
    cuda_versions: dict[str, str] = field(default_factory=dict)  # prefix -> version.json's cuda
    os: GuestOs | None = None  # /etc/os-release
    apt_verifier: str = GPGV  # how its apt checks signatures (gpuhost.guestsw.cudarepos SQV...)


def normalise(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


# --- commands ------------------------------------------------------------------------------------


def files_command(paths: tuple[str, ...]) -> str:
    quoted = " ".join(shlex.quote(p) for p in paths)
    return (
        f"for f in {quoted}; do "
        'if [ -L "$f" ]; then echo "L $f $(readlink "$f")"; '
        'elif [ -f "$f" ]; then echo "F $f $(base64 -w0 <"$f")"; fi; done'
    )


SYSTEM = (
    "uname -m; nproc; awk '/^MemTotal:/ {print $2 * 1024}' /proc/meminfo; "
    "cat /sys/fs/cgroup/memory.max 2>/dev/null || echo none"
)
TOOLKITS = (
    "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n' 'cuda-toolkit-*' "
    "2>/dev/null || true"
)
ALTERNATIVES = (
    'echo "alt $(readlink /etc/alternatives/cuda)"; echo "link $(readlink /usr/local/cuda)"'
)
UV = f"sha256sum {UV_PATH} 2>/dev/null || true"
# Each toolkit's own version, from the version.json NVIDIA's toolkits carry (CUDA >= 11.1).
CUDA_VERSIONS = (
    'for d in /usr/local/cuda-*; do if [ -f "$d/version.json" ]; then '
    'python3 -c \'import json, sys; print(sys.argv[1], json.load(open(sys.argv[1] + "/version.json"))'
    '["cuda"]["version"])\' "$d" 2>/dev/null; fi; done; true'
)
OS_RELEASE = "cat /etc/os-release 2>/dev/null || cat /usr/lib/os-release 2>/dev/null || true"
# apt's OpenPGP verifier: the sqv method from apt 2.9.19 (Debian 13), a policy of the operator's
# in the files apt reads before Debian's default (apt's NEWS.Debian, 2.9.19), else gpgv.
APT_VERIFIER = (
    f"if [ -x /usr/lib/apt/methods/sqv ]; then "
    'if [ -n "$APT_SEQUOIA_CRYPTO_POLICY" ] || [ -e /etc/crypto-policies/back-ends/apt-sequoia.config ] '
    "|| [ -e /var/lib/crypto-config/profiles/current/apt-sequoia.config ]; "
    f"then echo {SQV_POLICY}; else echo {SQV}; fi; else echo {GPGV}; fi"
)
_LIST_DISTS = (
    "import importlib.metadata as m\n"
    "for d in m.distributions():\n"
    "    print('dist', d.metadata['Name'], d.version)"
)


def venv_command(path: str, imports: tuple[str, ...] = ()) -> str:
    """The venv's state; with ``imports`` (the audit) also whether they import."""
    p = shlex.quote(path)
    probe = ""
    if imports:
        code = shlex.quote("import " + ", ".join(imports))
        probe = (
            f"if [ -x {p}/bin/python ]; then if err=$({p}/bin/python -c {code} 2>&1); then "
            'echo "imports ok"; else echo "imports $(printf %s "$err" | tail -n 1)"; fi; fi; '
        )
    return probe + (
        f"if [ -e {p} ]; then echo exists; fi; "
        f"if [ -f {p}/pyvenv.cfg ]; then sed -n 's/^version\\(_info\\)\\? *= */python /p' {p}/pyvenv.cfg; fi; "
        f'if [ -f {p}/{STAMP} ]; then echo "stamp $(cat {p}/{STAMP})"; fi; '
        f"if grep -qF {shlex.quote(HOOK)} {p}/bin/activate 2>/dev/null; then echo hooked; fi; "
        f"if [ -x {p}/bin/python ]; then {p}/bin/python -c {shlex.quote(_LIST_DISTS)} 2>/dev/null; fi; "
        "true"
    )


def service_command(name: str) -> str:
    unit = shlex.quote(f"gpuhost-{name}.service")
    stamp = shlex.quote(f"{SERVICE_STAMPS}/service-{name}.stamp")
    return (
        f"systemctl show -p ActiveState -p UnitFileState -p MainPID {unit} 2>/dev/null; "
        f'if [ -f {stamp} ]; then echo "stamp=$(cat {stamp})"; fi; '
        f"pid=$(systemctl show -p MainPID {unit} 2>/dev/null | cut -d= -f2); "
        'if [ -n "$pid" ] && [ "$pid" != 0 ]; then tr "\\0" "\\n" < /proc/$pid/environ '
        "| sed 's/^/environ /'; fi; true"
    )


def commands(
    paths: tuple[str, ...],
    venvs: tuple[str, ...],
    services: tuple[str, ...],
    imports: dict[str, tuple[str, ...]] | None = None,
) -> tuple[tuple[str, str, str | None], ...]:
    """``(key, command, tool)`` for :class:`facts.snapshot.Combined`; ``imports`` (venv ->
    modules) adds the audit's import probes."""
    out = [
        ("driver", "cat /proc/driver/nvidia/version 2>/dev/null || true", None),
        ("system", SYSTEM, None),
        ("files", files_command(paths), None),
        ("toolkits", TOOLKITS, None),
        ("alternatives", ALTERNATIVES, None),
        ("uv", UV, None),
        ("cuda_versions", CUDA_VERSIONS, None),
        ("os", OS_RELEASE, None),
        ("apt_verifier", APT_VERIFIER, None),
    ]
    imports = imports or {}
    out += [(f"venv:{p}", venv_command(p, imports.get(p, ())), None) for p in venvs]
    out += [(f"service:{name}", service_command(name), None) for name in services]
    return tuple(out)


# --- parsers -------------------------------------------------------------------------------------


def parse_system(lines: list[str]) -> System:
    if len(lines) < 4:
        raise UnparsedOutput("guest system", "\n".join(lines), "expected 4 lines")
    machine, cpus, total, limit = (line.strip() for line in lines[:4])
    try:
        return System(
            machine, int(cpus), int(float(total)), None if limit in ("max", "none") else int(limit)
        )
    except ValueError:
        raise UnparsedOutput("guest system", "\n".join(lines), "numbers expected") from None


def parse_toolkits(lines: list[str]) -> dict[str, str]:
    found = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[2] == "ii":  # installed and configured
            found[parts[0]] = parts[1]
    return found


def parse_alternatives(lines: list[str]) -> tuple[str | None, str | None]:
    values = {}
    for line in lines:
        key, _, value = line.partition(" ")
        values[key] = value.strip() or None
    return values.get("alt"), values.get("link")


def parse_uv(lines: list[str]) -> str | None:
    for line in lines:
        parts = line.split()
        if parts and re.fullmatch(r"[0-9a-f]{64}", parts[0]):
            return parts[0]
    return None


def parse_venv(lines: list[str]) -> VenvState:
    python, stamp, hooked, exists, imports = None, None, False, False, None
    dists: dict[str, str] = {}
    for line in lines:
        key, _, rest = line.partition(" ")
        if key == "exists":
            exists = True
        elif key == "python" and python is None:
            python = rest.strip()
        elif key == "stamp":
            stamp = rest.strip() or None
        elif key == "hooked":
            hooked = True
        elif key == "imports":
            imports = rest.strip()
        elif key == "dist":
            match = _DIST.fullmatch(rest.strip())
            if match:
                dists[normalise(match["name"])] = match["version"]
    return VenvState(python, exists, stamp, hooked, dists, imports)


def parse_service(lines: list[str]) -> ServiceState:
    environ = dict(
        line.removeprefix("environ ").partition("=")[::2]
        for line in lines
        if line.startswith("environ ") and "=" in line
    )
    values = dict(
        line.partition("=")[::2]
        for line in lines
        if "=" in line and not line.startswith("environ ")
    )
    try:
        pid = int(values.get("MainPID") or 0)
    except ValueError:
        pid = 0
    return ServiceState(
        values.get("ActiveState", ""),
        values.get("UnitFileState", ""),
        pid,
        values.get("stamp") or None,
        environ,
    )


def parse_guest(raw: dict[str, tuple[int, list[str]]]) -> GuestFacts:
    def lines(key: str) -> list[str]:
        status, out = raw.get(key, (0, []))
        if status != 0:
            raise UnparsedOutput(f"guest fact {key}", "\n".join(out[:3]), f"exit {status}")
        return out

    alt, link = parse_alternatives(lines("alternatives"))
    return GuestFacts(
        driver=parse_driver_version(lines("driver")),
        system=parse_system(lines("system")),
        files=parse_managed_files(lines("files")),
        toolkits=parse_toolkits(lines("toolkits")),
        cuda_alternative=alt,
        cuda_link=link,
        uv_sha256=parse_uv(lines("uv")),
        venvs={k[5:]: parse_venv(lines(k)) for k in raw if k.startswith("venv:")},
        services={k[8:]: parse_service(lines(k)) for k in raw if k.startswith("service:")},
        cuda_versions=dict(
            line.split(" ", 1) for line in lines("cuda_versions") if line.count(" ") == 1
        ),
        os=parse_os_release(lines("os")),
        apt_verifier=parse_verifier(lines("apt_verifier")),
    )


def parse_verifier(lines: list[str]) -> str:
    found = lines[0].strip() if lines else GPGV
    if found not in (SQV, SQV_POLICY, GPGV):
        raise UnparsedOutput("apt verifier", found, f"one of {SQV}, {SQV_POLICY}, {GPGV}")
    return found
