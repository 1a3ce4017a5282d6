"""The guest software plan: refusals, the MAX_JOBS rule, files, and convergence from facts."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuhost.guestsw.indexconf import IndexConfig, control_indexes
from gpuhost.guestsw.model import KEYRING, PROFILE, SOURCES, UV_CONFIG, Control, GuestPlanError
from gpuhost.guestsw.plan import make_guest_plan, max_jobs, planned_paths
from gpuhost.guestsw.render import render_guest_plan
from gpuhost.observe.files import ManagedFiles
from gpuhost.observe.guestsoft import (
    GuestFacts,
    GuestOs,
    ServiceState,
    System,
    VenvState,
    commands,
    parse_guest,
)
from gpuhost.observe.nvidia_driver import DriverVersion
from gpuhost.spec.guests import LxcGuest

GIB = 1 << 30
DEBIAN12 = GuestOs("debian", "12", "Debian GNU/Linux 12 (bookworm)")
KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\nmDMEZ...\n-----END PGP PUBLIC KEY BLOCK-----\n"
CONTROL = Control(
    "x86_64", "/venv/bin/uv", "a" * 64, KEY, None, IndexConfig("https://idx.test/simple")
)
VENV = "/opt/venvs/vllm"


def guest(**kw: object) -> LxcGuest:
    base: dict = {
        "name": "ct200",
        "ctid": 200,
        "cuda": ["12.8", "13.0"],
        "cuda_repo": {"url": "https://repo.test/cuda/debian12/x86_64/", "keyring": "/k.pub"},
        "venvs": [
            {
                "path": VENV,
                "python": "3.11",
                "cuda": "12.8",
                "packages": ["vllm==0.11.0"],
                "constraints": ["torch==2.9.1"],
                "service": {"name": "vllm", "command": ["vllm", "serve", "--port=8000"]},
            }
        ],
    }
    base.update(kw)
    return LxcGuest.model_validate(base)


def facts(driver: str | None = "595.71.05", **kw: object) -> GuestFacts:
    base = GuestFacts(
        driver=DriverVersion(driver, True, "gcc version 12.2.0", "12.2.0") if driver else None,
        system=System("x86_64", 128, 192 * GIB, None),
        files=ManagedFiles(),
        toolkits={},
        cuda_alternative=None,
        cuda_link=None,
        uv_sha256=None,
        venvs={},
        services={},
        os=DEBIAN12,
    )
    return replace(base, **kw)


def problems(g: LxcGuest, f: GuestFacts, control: Control = CONTROL) -> list[str]:
    with pytest.raises(GuestPlanError) as exc:
        make_guest_plan("ct200", g, {}, f, control)
    return exc.value.problems


def test_max_jobs_comes_from_memory_and_cores_never_cores_alone() -> None:
    assert max_jobs(128, 192 * GIB, None, 9)[0] == 21  # memory-bound: not 128
    assert max_jobs(8, 512 * GIB, None, 9)[0] == 8  # core-bound
    assert max_jobs(128, 512 * GIB, 64 * GIB, 9)[0] == 7  # the cgroup's limit, not MemTotal
    assert max_jobs(4, 4 * GIB, None, 9)[0] == 1  # at least one job
    assert "min(128 cores, 192.0 GiB / 9 GiB per job = 21)" in max_jobs(128, 192 * GIB, None, 9)[1]


def test_a_toolkit_the_host_driver_branch_cannot_run_is_refused_naming_the_minimum() -> None:
    (problem,) = problems(guest(), facts("575.64.05"))
    assert "CUDA 13.0 needs an NVIDIA driver of branch 580 or newer" in problem
    assert "575.64.05" in problem
    (problem,) = problems(guest(), facts(None))
    assert "does not see the host's NVIDIA driver" in problem


def test_a_requirement_that_contradicts_a_pin_is_refused() -> None:
    g = guest(venvs=[{"path": VENV, "packages": ["torch<2.9"], "constraints": ["torch==2.9.1"]}])
    (problem,) = problems(g, facts())
    assert "'torch<2.9' would move pinned torch from 2.9.1" in problem


def test_the_key_must_be_armored_and_the_repository_named() -> None:
    (problem,) = problems(guest(), facts(), replace(CONTROL, keyring="\x99binary"))
    assert "not an ASCII-armored OpenPGP key" in problem
    g = LxcGuest.model_validate({"name": "ct200", "ctid": 200, "cuda": ["12.8"]})
    (problem,) = problems(g, facts())
    assert "cuda needs cuda_repo" in problem


def test_uv_is_pushed_only_to_a_guest_of_the_control_machines_architecture() -> None:
    f = facts(system=System("aarch64", 8, 64 * GIB, None))
    assert any("the guest is aarch64" in p for p in problems(guest(), f))


def test_the_plan_files_repository_default_environment_and_unit() -> None:
    plan = make_guest_plan("ct200", guest(), {"NCCL_P2P_DISABLE": "1"}, facts(), CONTROL)
    sources = plan.files[SOURCES].content
    assert "URIs: https://repo.test/cuda/debian12/x86_64/\nSuites: /\n" in sources
    assert f"Signed-By: {KEYRING}" in sources and plan.files[KEYRING].content == KEY
    assert plan.install_toolkits == ["cuda-toolkit-12-8", "cuda-toolkit-13-0"]
    assert plan.default is not None and plan.default.prefix == "/usr/local/cuda-13.0"  # newest
    profile = plan.files[PROFILE].content
    assert "export NCCL_P2P_DISABLE='1'" in profile and "export MAX_JOBS='21'" in profile
    env = plan.files[f"/etc/gpuhost/venvs{VENV}/env"].content
    assert "CUDA_HOME=/usr/local/cuda-12.8" in env and "NCCL_P2P_DISABLE=1" in env
    assert f"UV_CONSTRAINT=/etc/gpuhost/venvs{VENV}/constraints.txt" in env
    reqs = plan.files[f"/etc/gpuhost/venvs{VENV}/requirements.txt"].content
    assert reqs.endswith("vllm==0.11.0\ntorch==2.9.1")  # a pin is installed too
    unit = plan.files["/etc/systemd/system/gpuhost-vllm.service"].content
    assert f"EnvironmentFile=/etc/gpuhost/venvs{VENV}/env" in unit
    assert f"ExecStart={VENV}/bin/vllm serve --port=8000" in unit
    assert 'url = "https://idx.test/simple"\ndefault = true' in plan.files[UV_CONFIG].content
    (venv,) = plan.venvs
    assert (venv.create, venv.install, venv.imports) == ("missing", "new venv", ("torch",))
    assert "CUDA 12.8: cuda-toolkit-12-8 -> /usr/local/cuda-12.8 [install]" in render_guest_plan(
        plan
    )
    assert set(plan.files) <= set(planned_paths(guest())[0])


def converged(g: LxcGuest, env: dict[str, str] | None = None) -> GuestFacts:
    """What the guest shows after a run of this plan."""
    plan = make_guest_plan("ct200", g, env or {}, facts(), CONTROL)
    (venv,) = plan.venvs
    (svc,) = plan.services
    return facts(
        files=ManagedFiles({p: f.content for p, f in plan.files.items() if f.content}),
        toolkits={"cuda-toolkit-12-8": "12.8.1-1", "cuda-toolkit-13-0": "13.0.2-1"},
        cuda_alternative="/usr/local/cuda-13.0",
        cuda_link="/etc/alternatives/cuda",
        uv_sha256="a" * 64,
        venvs={VENV: VenvState("3.11.2", True, venv.stamp, True, {"torch": "2.9.1"})},
        services={"vllm": ServiceState("active", "enabled", 42, svc.stamp)},
    )


def test_a_converged_guest_needs_nothing() -> None:
    plan = make_guest_plan("ct200", guest(), {}, converged(guest()), CONTROL)
    assert plan.install_toolkits == [] and not plan.set_default and not plan.push_uv
    (venv,) = plan.venvs
    assert (venv.create, venv.install, venv.hook) == (None, None, False)
    assert plan.services[0].restart is None and not plan.services[0].enable


def test_what_makes_a_venv_install_or_a_service_restart() -> None:
    f = converged(guest())
    moved = replace(f, venvs={VENV: replace(f.venvs[VENV], dists={"torch": "2.8.0"})})
    (venv,) = make_guest_plan("ct200", guest(), {}, moved, CONTROL).venvs
    assert venv.install == "pinned packages moved: torch 2.8.0 (pin 2.9.1)"
    older = replace(f, venvs={VENV: replace(f.venvs[VENV], python="3.10.12")})
    (venv,) = make_guest_plan("ct200", guest(), {}, older, CONTROL).venvs
    assert venv.create == "it has python 3.10.12, the spec wants 3.11"
    # a new environment from the host's Plan restarts the service; nothing else does
    plan = make_guest_plan("ct200", guest(), {"NCCL_P2P_DISABLE": "1"}, f, CONTROL)
    assert plan.services[0].restart == "its unit, environment or venv changed since it started"
    assert plan.venvs[0].install is None  # the environment does not reinstall the venv
    stopped = replace(f, services={"vllm": ServiceState("failed", "enabled", 0, "x")})
    assert (
        make_guest_plan("ct200", guest(), {}, stopped, CONTROL).services[0].restart
        == "it is failed"
    )


def test_spec_grammar_for_guest_software() -> None:
    with pytest.raises(ValidationError, match=r"cuda_default '12\.9' is not in cuda"):
        guest(cuda_default="12.9")
    with pytest.raises(ValidationError, match="not an apt repository URL"):
        guest(cuda_repo={"url": "https://repo.test/cuda;rm -rf /", "keyring": "/k"})
    with pytest.raises(ValidationError, match="carries credentials"):
        guest(python_index=["https://user:tok@idx.test/simple"])
    with pytest.raises(ValidationError, match="not a service command word"):
        guest(venvs=[{"path": VENV, "service": {"name": "x", "command": ["vllm serve"]}}])
    with pytest.raises(ValidationError, match="used twice"):
        guest(venvs=[{"path": VENV}, {"path": VENV}])


def test_the_control_machines_index_settings_are_what_guests_get(tmp_path: Path) -> None:
    pip = tmp_path / "pip.conf"
    pip.write_text(
        "[global]\ncert = /etc/ssl/ca.pem\nindex-url = https://mirror.test/simple\n"
        "extra-index-url = file:///opt/pypi/simple https://extra.test/simple\n"
    )
    found = control_indexes({"PIP_CONFIG_FILE": str(pip)}, tmp_path)
    assert found.default == "https://mirror.test/simple"
    assert found.extra == ("https://extra.test/simple",) and found.cert == "/etc/ssl/ca.pem"
    assert found.skipped == ("file:///opt/pypi/simple (not an http(s) index a guest can reach)",)
    env = {"UV_DEFAULT_INDEX": "https://u:secret@uv.test/simple", "PIP_CONFIG_FILE": str(pip)}
    found = control_indexes(env, tmp_path)
    assert found.default is None and "secret" not in " ".join(found.skipped)


def test_the_guest_fact_parses_one_combined_output() -> None:
    raw = {
        "driver": (
            0,
            [
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  595.71.05  "
                "Release Build  (dvs-builder@U22)  Wed Jan 14 00:00:00 UTC 2026",
                "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)",
            ],
        ),
        "system": (0, ["x86_64", "16", "67108864000", "max"]),
        "files": (0, ["F /etc/profile.d/gpuhost-env.sh ZXhwb3J0IEE9JzEnCg=="]),
        "toolkits": (0, ["cuda-toolkit-12-8 12.8.1-1 ii", "cuda-toolkit-13-0 13.0.2-1 rc"]),
        "alternatives": (0, ["alt /usr/local/cuda-12.8", "link /etc/alternatives/cuda"]),
        "uv": (0, ["b" * 64 + "  /usr/local/bin/uv"]),
        f"venv:{VENV}": (0, ["exists", "python 3.11.2", "stamp abc", "hooked", "dist Torch 2.9.1"]),
        "service:vllm": (
            0,
            ["ActiveState=active", "UnitFileState=enabled", "MainPID=7", "stamp=s"],
        ),
    }
    f = parse_guest(raw)
    assert f.driver is not None and f.driver.version == "595.71.05"
    assert f.system == System("x86_64", 16, 67108864000, None)
    assert f.files.files == {"/etc/profile.d/gpuhost-env.sh": "export A='1'\n"}
    assert f.toolkits == {"cuda-toolkit-12-8": "12.8.1-1"}  # "rc": removed, config left
    assert (f.cuda_alternative, f.cuda_link) == ("/usr/local/cuda-12.8", "/etc/alternatives/cuda")
    assert f.venvs[VENV] == VenvState("3.11.2", True, "abc", True, {"torch": "2.9.1"})
    assert f.services["vllm"] == ServiceState("active", "enabled", 7, "s")
    keys = [k for k, _, _ in commands(("/a b",), (VENV,), ("vllm",))]
    assert keys[-2:] == [f"venv:{VENV}", "service:vllm"]
    assert "'/a b'" in commands(("/a b",), (), ())[2][1]  # paths are quoted


def test_secret_named_variables_stay_out_of_profile_d_and_the_printed_plan() -> None:
    g = guest(env={"HF_TOKEN": "hf_abc123", "NCCL_ALGO": "Ring"})
    plan = make_guest_plan("ct200", g, dict(g.env), facts(), CONTROL)
    assert "HF_TOKEN" not in plan.files[PROFILE].content
    env = plan.files[f"/etc/gpuhost/venvs{VENV}/env"]
    assert "HF_TOKEN=hf_abc123" in env.content and env.mode == "600"
    text = render_guest_plan(plan)
    assert "hf_abc123" not in text and "NCCL_ALGO=Ring" in text
