"""A run's preconditions: what it needs from the control machine, read there and judged while
planning (gpuhost/control.py, gpuhost/plan/preconditions.py), on kpro6-shaped facts."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpuhost.build.artifacts import ArtifactKey, ArtifactStore
from gpuhost.control import read_control
from gpuhost.plan.driver.modules import MODULES_KIND
from gpuhost.plan.make import make_plan
from gpuhost.plan.render import render_plan
from gpuhost.spec.host import HostSpec
from gpuhost.spec.inventory import load_hosts
from tests.unit.hosts import kpro6
from tests.unit.test_driver_modules import KPRO6_COMPILERS, TREE

VERSION = "595.71.05"
SECRET = "0b0e9a52-5bb4-4e0c-9f52-6d3c3b3b2a1f"
TOKEN = f"root@pam!gpuhost={SECRET}"
KERNEL = "6.8.12-9-pve"
COMPILER = "gcc (Debian 12.2.0-14) 12.2.0"


def plan(spec: dict, environ: dict[str, str] | None = None, **raw: tuple[int, list[str]]):
    host = HostSpec.model_validate(spec)
    facts = kpro6(KernelCompilers=(0, KPRO6_COMPILERS), **raw)
    return make_plan("kpro6", host, facts, None, read_control(host, facts, None, environ or {}))


def lines(made) -> dict[str, str]:
    return {p.name: p.line() for p in made.preconditions}


def test_driver_files_are_needed_and_the_tree_only_without_a_stored_build(tmp_path: Path) -> None:
    installer = tmp_path / f"NVIDIA-Linux-x86_64-{VERSION}.run"
    source = {"tree": str(tmp_path / "no-tree"), "store": str(tmp_path / "store")}
    spec = {
        "kernel": {"version": KERNEL},
        "driver": {"version": VERSION, "source": {**source, "installer": str(installer)}},
    }
    found = lines(plan(spec))
    assert found["driver.source.installer"].startswith("FAILED")
    assert (
        f"{installer} cannot be read (No such file or directory)"
        in found["driver.source.installer"]
    )
    assert (
        found["driver.source.tree"].startswith("FAILED")
        and "no version.mk" in (found["driver.source.tree"])
    )

    installer.write_text("#!/bin/sh\n")
    shutil.copytree(TREE, tmp_path / "tree")
    spec["driver"]["source"]["tree"] = str(tmp_path / "tree")
    found = lines(plan(spec))
    assert found["driver.source.installer"].startswith("ok")
    assert found["driver.source.tree"].startswith("ok")

    # A build of these modules for the kernel in the store: the tree is not needed at all.
    module = tmp_path / "nvidia.ko"
    module.write_bytes(b"\0")
    key = ArtifactKey(MODULES_KIND, VERSION, KERNEL, COMPILER)
    ArtifactStore(tmp_path / "store").put(key, [module])
    spec["driver"]["source"]["tree"] = str(tmp_path / "gone")
    made = plan(spec)
    assert "driver.source.tree" not in lines(made)
    assert all(p.holds for p in made.preconditions)


def test_a_kernel_from_the_store_needs_it_there(tmp_path: Path) -> None:
    spec = {
        "kernel": {"version": "6.14.8-2-bpo12-pve", "source": "build", "build": {"repo": "/src"}},
        "driver": {"version": VERSION},
        "artifacts": {"store": str(tmp_path / "store")},
    }
    found = lines(plan(spec))
    assert found["artifacts.store"].startswith("FAILED")
    assert "kernel 6.14.8-2-bpo12-pve is not in the artifact store" in found["artifacts.store"]
    deb = tmp_path / "linux-image-6.14.8-2-bpo12-pve_1_amd64.deb"
    deb.write_bytes(b"!<arch>\n")
    key = ArtifactKey("kernel", "6.14.8-2-bpo12-pve", "6.14.8-2-bpo12-pve", COMPILER, "abc")
    ArtifactStore(tmp_path / "store").put(key, [deb])
    assert lines(plan(spec))["artifacts.store"].startswith("ok")
    # the running kernel is not installed again: no store needed
    assert "artifacts.store" not in lines(
        plan({**spec, "kernel": {**spec["kernel"], "version": KERNEL}})
    )


def test_the_token_is_needed_only_when_the_run_writes_through_the_api(tmp_path: Path) -> None:
    vm = {"kind": "vm", "vmid": 129, "name": "vm129", "machine": "q35", "gpus": ["0000:c1:00.0"]}
    spec = {
        "kernel": {"version": KERNEL},
        "driver": {"version": VERSION},
        "guests": [vm],
        "proxmox": {"token_file": str(tmp_path / "token")},
    }
    made = plan(spec)
    (token,) = [p for p in made.preconditions if p.name == "proxmox.token_file"]
    assert not token.holds and "cannot be read" in (token.problem or "")
    assert "PCI mapping gpuhost-0000-c1-00" in token.needs and "vm 129's GPU entries" in token.needs
    assert "FAILED      proxmox.token_file (needed to write through the Proxmox API" in (
        render_plan(made)
    )
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "token").chmod(0o644)
    assert "chmod 600" in (plan(spec).preconditions[0].problem or "")
    (tmp_path / "token").chmod(0o600)
    made = plan(spec)
    assert made.preconditions[0].holds and SECRET not in render_plan(made)

    from_env = {**spec, "proxmox": {"token_env": "PVE_TOKEN"}}
    made = plan(from_env, {"PVE_TOKEN": "root@pam!gpuhost=not-a-uuid-secret"})
    assert "does not hold an API token" in (made.preconditions[0].problem or "")
    assert "not-a-uuid-secret" not in render_plan(made)
    assert plan(from_env, {"PVE_TOKEN": TOKEN}).preconditions[0].holds

    # no VM with GPUs and no gpuhost mapping: the API is not used, so no token is needed
    assert plan({**spec, "guests": []}).preconditions == []


def test_a_plan_made_without_the_control_machine_says_not_checked() -> None:
    spec = HostSpec.model_validate(
        {
            "kernel": {"version": KERNEL},
            "driver": {"version": VERSION},
            "guests": [{"kind": "vm", "vmid": 129, "name": "vm129", "gpus": ["0000:c1:00.0"]}],
        }
    )
    made = make_plan("kpro6", spec, kpro6())
    assert [(p.name, p.checked, p.holds) for p in made.preconditions] == [
        ("proxmox.token_env", False, False)
    ]
    assert "not checked proxmox.token_env" in render_plan(made)


def test_an_unreachable_build_host_fails_the_kernel_precondition(tmp_path: Path) -> None:
    inv = tmp_path / "site.py"
    inv.write_text(
        "from gpuhost.spec.inventory import build_host, gpu_host\n"
        "SPEC = {'kernel': {'version': '6.14.8-2-bpo12-pve', 'source': 'build', "
        "'build': {'repo': '/src'}}, 'driver': {'version': '595.71.05'}, "
        "'artifacts': {'build_host': 'builder'}}\n"
        "builder = build_host('builder', ssh_hostname='127.0.0.1', ssh_port=1, ssh_user='root')\n"
        "hosts = [gpu_host('kpro6', SPEC, ssh_hostname='127.0.0.1')]\n"
    )
    spec = load_hosts(inv)[0]["kpro6"][0]
    facts = kpro6()
    made = make_plan("kpro6", spec, facts, str(inv), read_control(spec, facts, str(inv), {}))
    (store,) = [p for p in made.preconditions if p.name == "artifacts.build_host"]
    assert not store.holds and "build host builder: cannot connect" in (store.problem or "")
    assert "to install kernel 6.14.8-2-bpo12-pve from it" in store.needs
