"""A GPU guest's software plan: CUDA toolkits, uv venvs with pins, environment and services.

Pure: made from the guest's spec entry, the environment the host's Plan gives this guest
(``Plan.guest_env``: the spec's env plus NCCL_P2P_DISABLE=1 where P2P is unsafe), what the guest
shows (gpuhost/observe/guestsoft.py) and what the control machine holds (uv, the repository key, its
package index settings). A plan that cannot work is refused before anything changes: a toolkit
the host driver branch cannot run, a requirement that contradicts a pin, a missing key.
"""

from __future__ import annotations

import hashlib

from packaging.requirements import Requirement

from gpuhost.guestsw import files as guestfiles
from gpuhost.guestsw.cudarepos import repo_problems, supported_repo
from gpuhost.guestsw.indexconf import IndexConfig
from gpuhost.guestsw.model import (
    INDEX_CA,
    KEYRING,
    PROFILE,
    SOURCES,
    UV_CONFIG,
    VENV_CONFIG,
    Control,
    GuestPlan,
    GuestPlanError,
    ServicePlan,
    Toolkit,
    VenvPlan,
)
from gpuhost.observe.guestsoft import (
    HOOK,
    STAMP,
    GuestFacts,
    ServiceState,
    VenvState,
    normalise,
)
from gpuhost.plan.model import ManagedFile
from gpuhost.redact import is_secret_name
from gpuhost.spec.grammar import CUDA_MIN_DRIVER
from gpuhost.spec.guests import LxcGuest, Venv

GIB = 1 << 30


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def max_jobs(cpus: int, mem_total: int, mem_limit: int | None, job_gib: int) -> tuple[int, str]:
    """MAX_JOBS for source builds: as many jobs as both the cores and the memory allow.

    Memory is the guest's limit (the cgroup's memory.max, else MemTotal), not what is free now,
    so the value, and every file holding it, stays put between runs."""
    memory = min(mem_total, mem_limit) if mem_limit else mem_total
    by_memory = memory // (job_gib * GIB)
    jobs = max(1, min(cpus, by_memory))
    rule = (
        f"MAX_JOBS={jobs}: min({cpus} cores, {memory / GIB:.1f} GiB / {job_gib} GiB per job "
        f"= {by_memory}), at least 1"
    )
    return jobs, rule


def _pins(venv: Venv) -> dict[str, str]:
    pins = {}
    for text in venv.constraints:
        req = Requirement(text)
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
            pins[normalise(req.name)] = specs[0].version
    return pins


def _pin_problems(j: int, venv: Venv, pins: dict[str, str]) -> list[str]:
    problems = []
    for text in venv.packages:
        req = Requirement(text)
        pin = pins.get(normalise(req.name))
        if pin is not None and not req.specifier.contains(pin, prereleases=True):
            problems.append(
                f"venvs[{j}] ({venv.path}): package {text!r} would move pinned {req.name} from "
                f"{pin} (constraints); drop it, or change the pin"
            )
    return problems


def _python_matches(wanted: str, found: str | None) -> bool:
    return found is not None and found.split(".")[: len(wanted.split("."))] == wanted.split(".")


def _toolkit_problems(guest: LxcGuest, facts: GuestFacts) -> list[str]:
    if not guest.cuda:
        return []
    if facts.driver is None:
        return [
            "cuda: the guest does not see the host's NVIDIA driver (/proc/driver/nvidia/version "
            "is empty), so no toolkit can be checked against it; load the driver on the host"
        ]
    branch = int(facts.driver.version.split(".")[0])
    return [
        f"cuda: CUDA {v} needs an NVIDIA driver of branch {CUDA_MIN_DRIVER[v]} or newer, but the "
        f"host driver is {facts.driver.version} (/proc/driver/nvidia/version in the guest); "
        f"upgrade driver.version on the host, or remove {v!r} from cuda"
        for v in guest.cuda
        if branch < CUDA_MIN_DRIVER[v]
    ]


def _imports(venv: Venv, pins: dict[str, str]) -> tuple[str, ...]:
    if venv.imports is not None:
        return tuple(venv.imports)
    return tuple(n.replace("-", "_") for n in pins)


def venv_imports(guest: LxcGuest) -> list[tuple[str, ...]]:
    """Per venv, the modules its import check imports."""
    return [_imports(v, _pins(v)) for v in guest.venvs]


def _config_dir(venv: Venv) -> str:
    return f"{VENV_CONFIG}{venv.path}"


def planned_paths(guest: LxcGuest) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(managed files, venv paths, service names) the guest fact must read for ``guest``."""
    paths = [PROFILE]
    if guest.cuda:
        paths += [KEYRING, SOURCES]
    if guest.venvs:
        paths += [UV_CONFIG, INDEX_CA]
    for venv in guest.venvs:
        d = _config_dir(venv)
        paths += [f"{d}/requirements.txt", f"{d}/constraints.txt", f"{d}/env", f"{d}/{HOOK}"]
        if venv.service:
            paths.append(_unit_path(venv.service.name))
    names = tuple(v.service.name for v in guest.venvs if v.service)
    return tuple(paths), tuple(v.path for v in guest.venvs), names


def _unit_path(name: str) -> str:
    return f"/etc/systemd/system/gpuhost-{name}.service"


def make_guest_plan(
    name: str, guest: LxcGuest, host_env: dict[str, str], facts: GuestFacts, control: Control
) -> GuestPlan:
    """The guest's software plan, or GuestPlanError with every problem."""
    problems = _toolkit_problems(guest, facts)
    files: dict[str, ManagedFile] = {}

    def put(path: str, content: str | None, mode: str = "644") -> None:
        files[path] = ManagedFile(path, content, "guest", mode)

    toolkits = [Toolkit(v) for v in guest.cuda]
    default = None
    if toolkits:
        wanted = guest.cuda_default or max(guest.cuda, key=lambda v: tuple(map(int, v.split("."))))
        default = Toolkit(wanted)
        key = control.keyring
        if guest.cuda_repo is None:
            problems.append(
                "cuda needs cuda_repo: the url of NVIDIA's CUDA repository for the guest's "
                "distribution and the path of its signing key (docs/guides/guest-software.md)"
            )
        elif key is None:
            problems.append(
                f"cuda_repo.keyring {guest.cuda_repo.keyring}: {control.keyring_error or 'unreadable'}"
            )
        elif "-----BEGIN PGP PUBLIC KEY BLOCK-----" not in key:
            problems.append(
                f"cuda_repo.keyring {guest.cuda_repo.keyring} is not an ASCII-armored OpenPGP "
                "key; give NVIDIA's <keyid>.pub, or `gpg --armor --export` of the key"
            )
        if guest.cuda_repo is not None:
            problems += repo_problems(
                facts.os,
                facts.apt_verifier,
                guest.cuda_repo.url,
                str(guest.cuda_repo.keyring),
                key if key and "-----BEGIN PGP PUBLIC KEY BLOCK-----" in key else None,
                list(guest.cuda),
            )
            put(KEYRING, key)
            put(SOURCES, guestfiles.sources(guest.cuda_repo.url, KEYRING))
    jobs, rule = max_jobs(
        facts.system.cpus, facts.system.mem_total, facts.system.mem_limit, guest.build_job_gib
    )
    full_env = {"MAX_JOBS": str(jobs), **host_env}  # the spec's own MAX_JOBS wins
    # profile.d is world-readable: secret-named variables (tokens) go to the venvs' root-only
    # env files only
    env = {k: v for k, v in full_env.items() if not is_secret_name(k)}
    put(PROFILE, guestfiles.shell_env(env, f"guest {name}: NCCL/CUDA environment from the Plan"))

    indexes = control.indexes
    if guest.python_index is not None:
        indexes = IndexConfig(
            guest.python_index[0] if guest.python_index else None,
            tuple(guest.python_index[1:]),
            source="spec python_index",
        )
    uv_toml = guestfiles.uv_toml(indexes)
    uv_env = {}
    if guest.venvs:
        put(UV_CONFIG, uv_toml)
        put(INDEX_CA, control.index_ca)  # absent when the control machine names none
        if control.index_ca:
            uv_env["SSL_CERT_FILE"] = INDEX_CA
        if control.uv_path is None or control.uv_sha256 is None:
            problems.append(
                "venvs: uv is not installed on the control machine (it is a gpuhost dependency: "
                "pip install uv)"
            )
        if facts.system.machine != control.machine:
            problems.append(
                f"venvs: the guest is {facts.system.machine} and the control machine "
                f"{control.machine}; gpuhost pushes the control machine's uv binary"
            )

    venvs, services = [], []
    for j, venv in enumerate(guest.venvs):
        pins = _pins(venv)
        problems += _pin_problems(j, venv, pins)
        state = facts.venvs.get(venv.path, VenvState(None, False, None, False))
        if state.exists and state.python is None:
            problems.append(
                f"venvs[{j}].path {venv.path} exists and is not a venv (no pyvenv.cfg); move it "
                "away or choose another path"
            )
        config_dir = _config_dir(venv)
        listed = {normalise(Requirement(p).name) for p in venv.packages}
        requirements = list(venv.packages) + [
            f"{n}=={v}" for n, v in sorted(pins.items()) if n not in listed
        ]
        req_text = guestfiles.HEADER.format(what=f"requirements of {venv.path}") + "\n".join(
            requirements
        )
        con_text = guestfiles.HEADER.format(what=f"pins of {venv.path}") + "\n".join(
            venv.constraints
        )
        imports = _imports(venv, pins)
        stamp = _digest(venv.python, req_text, con_text, uv_toml, " ".join(imports))
        cuda_home = Toolkit(venv.cuda).prefix if venv.cuda else None
        venv_env = {
            **full_env,
            "VIRTUAL_ENV": venv.path,
            "UV_CONSTRAINT": f"{config_dir}/constraints.txt",
            **({"CUDA_HOME": cuda_home} if cuda_home else {}),
            **venv.env,
        }
        put(f"{config_dir}/requirements.txt", req_text)
        put(f"{config_dir}/constraints.txt", con_text)
        env_text = guestfiles.env_file(venv_env, f"environment of {venv.path}")
        mode = "600" if any(is_secret_name(k) for k in venv_env) else "644"
        put(f"{config_dir}/env", env_text, mode)
        put(
            f"{config_dir}/{HOOK}",
            guestfiles.shell_env(
                venv_env, f"environment of {venv.path}, sourced by bin/activate", cuda_home
            ),
            mode,
        )
        create = None
        if state.python is None:
            create = "missing"
        elif not _python_matches(venv.python, state.python):
            create = f"it has python {state.python}, the spec wants {venv.python}"
        install = None
        if create:
            install = "new venv"
        elif state.stamp != stamp:
            install = "its requirements, pins or indexes changed"
        else:
            moved = [
                f"{n} {state.dists.get(n, 'missing')} (pin {v})"
                for n, v in pins.items()
                if state.dists.get(n) != v
            ]
            if moved:
                install = "pinned packages moved: " + ", ".join(moved)
        plan = VenvPlan(
            venv.path,
            venv.python,
            create,
            install,
            bool(create) or not state.hooked,
            pins,
            imports,
            stamp,
            cuda_home,
            config_dir,
        )
        venvs.append(plan)
        if venv.service:
            unit_path = _unit_path(venv.service.name)
            unit_text = guestfiles.unit(venv, plan.env_file)
            put(unit_path, unit_text)
            svc_stamp = _digest(unit_text, env_text, stamp)
            svc = facts.services.get(venv.service.name, ServiceState("", "", 0, None))
            restart = None
            if svc.active != "active":
                restart = f"it is {svc.active or 'not installed'}"
            elif svc.stamp != svc_stamp:
                restart = "its unit, environment or venv changed since it started"
            services.append(
                ServicePlan(
                    venv.service.name,
                    venv.path,
                    unit_path,
                    svc_stamp,
                    svc.enabled != "enabled",
                    restart,
                )
            )
    if problems:
        raise GuestPlanError(name, problems)
    notes = [f"package index left out: {s}" for s in indexes.skipped]
    if toolkits and facts.os is not None:
        notes.append(
            f"{facts.os.pretty}: NVIDIA's {supported_repo(facts.os)} repository, apt verifies with "
            f"{facts.apt_verifier}"
        )
    hidden = sorted(k for k in full_env if is_secret_name(k))
    if hidden:
        notes.append(f"secret-named, in the venvs' root-only env files only: {', '.join(hidden)}")
    extra = sorted(set(facts.toolkits) - {t.package for t in toolkits})
    if extra:
        notes.append(f"toolkits the spec does not name stay installed: {', '.join(extra)}")
    return GuestPlan(
        guest=name,
        driver=facts.driver.version if facts.driver else None,
        env=env,
        max_jobs=jobs,
        max_jobs_rule=rule,
        files=files,
        toolkits=toolkits,
        install_toolkits=[t.package for t in toolkits if t.package not in facts.toolkits],
        default=default,
        set_default=default is not None
        and (
            facts.cuda_alternative != default.prefix or facts.cuda_link != "/etc/alternatives/cuda"
        ),
        push_uv=bool(guest.venvs) and facts.uv_sha256 != control.uv_sha256,
        uv_path=control.uv_path,
        venvs=venvs,
        services=services,
        notes=notes,
        uv_env=uv_env,
    )


__all__ = ["STAMP", "GuestPlan", "GuestPlanError", "make_guest_plan"]
